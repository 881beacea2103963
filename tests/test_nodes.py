"""The emulated nodes of tests/nodes.py themselves: host names, private /tmp, kill, cut."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.nodes import Nodes, kept_under_tmp, skip_unless_available

pytestmark = pytest.mark.usefixtures("nodes_available")


@pytest.fixture(scope="module")
def nodes_available():
    skip_unless_available()


def _in(nodes: Nodes, node: str, script: str) -> str:
    proc = nodes.run(node, ["sh", "-c", script], stdout=subprocess.PIPE, text=True)
    return proc.communicate(timeout=30)[0]


def test_each_node_has_its_own_host_name_tmp_and_address_and_everything_goes_after():
    with Nodes(2) as nodes:
        _in(nodes, "node0", "echo zero > /tmp/mark")
        assert _in(nodes, "node0", "hostname; cat /tmp/mark").split() == ["node0", "zero"]
        seen = _in(nodes, "node1", "hostname; ls /tmp").split()  # and a clone's folder there
        assert seen == ["node1", *(Path(p).name for p in kept_under_tmp())]
        assert "10.77.0.2/24" in _in(nodes, "node1", "ip -br addr show eth0")
        assert "10.77.0.1 node0" in _in(nodes, "node1", "cat /etc/hosts")
        result = nodes.job(["hostname"], ranks=[1, 2])
        assert result.returncode == 0, result.output
        # (Open MPI's launcher may warn that its setpgid lost a race with the remote shell)
        hosts = re.findall(r"^node\d$", result.output, re.M)
        assert sorted(hosts) == ["node0", "node1", "node1"], result.output
        sleeper = nodes.run("node1", ["sleep", "60"])
        assert nodes.processes("node1") == [sleeper.pid]
        holders = [h.pid for h in nodes._holders.values()]
        shared = nodes.shared
    assert sleeper.wait(timeout=10) == -9
    assert not shared.exists()
    for pid in holders:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


PROBE = "python3 -c \"import socket; s = socket.create_connection(('node1', 9), timeout=1)\" 2>&1"


def test_kill_resets_a_node_s_connections_and_cut_drops_them():
    with Nodes(2) as nodes:
        # nothing listens on node1's port 9: refused while the link is up, no answer when cut
        assert "Connection refused" in _in(nodes, "node0", PROBE)
        nodes.cut("node1")
        assert "timed out" in _in(nodes, "node0", PROBE)
        nodes.mend("node1")
        assert "Connection refused" in _in(nodes, "node0", PROBE)
        nodes.run("node1", ["sleep", "60"])
        nodes.kill("node1")
        assert nodes.processes("node1") == []


def test_a_job_on_more_nodes_than_there_are_is_refused_before_it_starts():
    with Nodes(1) as nodes, pytest.raises(ValueError, match="ranks"):
        nodes.command(["hostname"], [1, 1])
