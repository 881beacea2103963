"""Emulated nodes on one machine, for jobs launched across hosts by each MPI's own launcher.

A node is a holder process (``sleep``) in namespaces of its own: UTS (its host name,
``node0``, ``node1``, ...), mount (a private ``/tmp`` and ``/dev/shm``, and an ``/etc/hosts``
naming every node), IPC (its own System V segments) and network (``lo`` and an ``eth0`` at
``10.77.0.<i+1>``). Each ``eth0`` is one end of a veth pair whose other end is on a bridge in
a network namespace made for it: no address or link is ever added to the host's own network.
Everything outside ``/tmp`` and ``/dev/shm`` (the repository, the virtual environments,
``Nodes.shared``) is one file system, seen alike from every node, as on a cluster; where the
repository or this Python's environment lies under ``/tmp`` (a clone there), its folder is
mounted into each node's ``/tmp`` as well.

Jobs start on ``node0`` with the ``mpiexec`` of this Python (as the suite's other jobs do),
told to reach the other hosts through ``ssh``: a stand-in script that, instead of logging
in, runs the command in the named node's namespaces (``nsenter``). MPICH's and Intel MPI's
Hydra (``-launcher ssh -launcher-exec``) and Open MPI's prterun (``plm_ssh_agent``) launch
their daemons through it, as they would through ``ssh`` on a cluster.

API (every method takes a node by name; ``ranks`` lists the ranks per node, in order):

- ``unavailable() -> str | None``: why nodes cannot be made here (not root, a tool missing,
  namespaces refused), or ``None``; ``skip_unless_available()`` skips a test with it.
- ``Nodes(count)``: a context manager; on leaving (on failure too) every process of every
  node is killed, the namespaces go with their last process, ``shared`` is removed.
- ``names``, ``addresses``, ``shared`` (a directory every node sees, for job scripts,
  outputs and checkpoints), ``ssh`` (the stand-in's path).
- ``run(node, argv, **popen_kwargs) -> Popen``: a command inside a node.
- ``command(argv, ranks) -> list[str]``: ``mpiexec`` with this MPI family's options to run
  ``argv`` on ``ranks[i]`` ranks of node ``i`` (ranks numbered node by node).
- ``launch(argv, ranks, env=None, **popen_kwargs) -> Popen``: that command started on
  ``node0``, in a session of its own, output piped (text), ``TMPDIR`` the node's own ``/tmp``.
- ``job(argv, ranks, env=None, timeout=60) -> JobResult``: ``launch`` to the end, killed
  past ``timeout`` (``returncode`` then ``None``); ``output``, ``elapsed`` in seconds.
- ``stop(proc) -> str``: every process of every node killed (the launcher's daemons and
  ranks hold its output open), then ``proc``'s output.
- ``processes(node) -> list[int]``: the pids in the node, its holder left out.
- ``kill(node)``: SIGKILL every process of the node (its holder stays, so ``cut`` and
  ``close`` still find it): the node is lost, its peers' connections are reset.
- ``cut(node)`` / ``mend(node)``: the node's link down (packets dropped, nothing reset, as a
  pulled cable) / up again.

Example (skipped where namespaces cannot be made)::

    with Nodes(2) as nodes:
        result = nodes.job(["hostname"], ranks=[1, 1])
        assert result.returncode == 0
        assert sorted(result.output.split()) == ["node0", "node1"]
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from collectives._launch.hosts import Host
from collectives._launch.launcher import launch_command, write_machinefile
from tests.spmd_launcher import REPO, launch_env, mpi_family, mpiexec

SUBNET = "10.77.0"

# Not under /tmp: every node has a /tmp of its own, and this directory must be seen by all.
SHARED_ROOT = Path("/var/tmp")

# ssh [options] host command...: the command, joined as ssh joins it, run by a shell inside
# the host's namespaces, with the node's own /tmp as TMPDIR (a login would not keep the
# caller's). Options that take a value are skipped with it, as ssh parses them.
SSH_STAND_IN = """#!/bin/sh
while [ $# -gt 0 ]; do
    case "$1" in
        -[bcDEeFIiJLlmOopQRSWw]) shift 2 ;;
        -*) shift ;;
        *) break ;;
    esac
done
host=${{1#*@}}
shift
pid=$(cat "{hosts}/$host" 2>/dev/null) || {{
    echo "ssh: Could not resolve hostname $host: Name or service not known" >&2
    exit 255
}}
exec nsenter -t "$pid" -u -m -i -n -- env TMPDIR=/tmp sh -c "$*"
"""

# A node's holder: it makes its private mounts and host name, says so, and then only waits.
# The folders given after the hosts file (under /tmp) stay seen through the node's own /tmp:
# held by a mount on the new /dev/shm while /tmp is replaced, then moved into it.
HOLDER = """set -e
hostname "$1"
hosts=$2
shift 2
mount -t tmpfs -o mode=1777 tmpfs /dev/shm
n=0
for keep in "$@"; do
    mkdir "/dev/shm/keep$n" && mount --bind "$keep" "/dev/shm/keep$n"
    n=$((n + 1))
done
mount -t tmpfs -o mode=1777 tmpfs /tmp
n=0
for keep in "$@"; do
    mkdir -p "$keep" && mount --move "/dev/shm/keep$n" "$keep" && rmdir "/dev/shm/keep$n"
    n=$((n + 1))
done
mount --bind "$hosts" /etc/hosts
ip link set lo up
echo ready
exec sleep infinity
"""

FABRIC = """set -e
ip link add name br0 type bridge
ip link set br0 up
echo ready
exec sleep infinity
"""


def kept_under_tmp() -> list[str]:
    """The folders right under ``/tmp`` that hold the repository, this Python's environment
    or its launcher: every node must see them, though each has a ``/tmp`` of its own."""
    kept = set()
    for path in (REPO, Path(sys.prefix), Path(sys.base_prefix), Path(mpiexec()).resolve()):
        path = path.resolve()
        if path.is_relative_to("/tmp") and path != Path("/tmp"):
            kept.add(str(Path("/tmp") / path.relative_to("/tmp").parts[0]))
    return sorted(kept)


def unavailable() -> str | None:
    """Why emulated nodes cannot be made here, or ``None`` when they can."""
    if sys.platform != "linux":
        return "emulated nodes need Linux namespaces"
    if os.geteuid() != 0:
        return "emulated nodes need root (to make namespaces, mounts and links)"
    for tool in ("unshare", "nsenter", "ip", "mount"):
        if shutil.which(tool) is None:
            return f"emulated nodes need `{tool}`, which is not on PATH"
    probe = subprocess.run(
        ["unshare", "-u", "-m", "-i", "-n", "--", "sh", "-c",
         "mount -t tmpfs tmpfs /tmp && ip link add name br0 type bridge"
         " && ip link add name v0 type veth peer name v1"],
        capture_output=True, text=True, timeout=30,
    )  # fmt: skip
    if probe.returncode != 0:
        return f"namespaces, mounts or links cannot be made here: {probe.stderr.strip()}"
    return None


def skip_unless_available() -> None:
    """``pytest.skip`` with the reason, where emulated nodes cannot be made."""
    reason = unavailable()
    if reason is not None:
        import pytest

        pytest.skip(reason)


@dataclass
class JobResult:
    returncode: int | None  # None: killed past its time limit
    output: str  # stdout and stderr together, as the launcher gathered them
    elapsed: float


class Nodes:
    """``count`` emulated nodes; see the module's docstring."""

    def __init__(self, count: int) -> None:
        if count < 1:
            raise ValueError(f"count must be at least 1, got {count}")
        self.names = [f"node{i}" for i in range(count)]
        self.addresses = [f"{SUBNET}.{i + 1}" for i in range(count)]
        self.shared = Path(tempfile.mkdtemp(prefix="nodes-", dir=SHARED_ROOT))
        self.ssh = self.shared / "ssh"
        self._holders: dict[str, subprocess.Popen] = {}
        self._fabric: subprocess.Popen | None = None
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Nodes:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _make(self) -> None:
        hosts = self.shared / "etc-hosts"
        lines = ["127.0.0.1 localhost"]
        lines += [f"{a} {n}" for a, n in zip(self.addresses, self.names)]
        hosts.write_text("\n".join(lines) + "\n")
        self._fabric = _holder(["unshare", "-n", "--", "sh", "-c", FABRIC])
        for name in self.names:
            self._holders[name] = _holder(
                ["unshare", "-u", "-m", "-i", "-n", "--propagation", "private", "--",
                 "sh", "-c", HOLDER, "holder", name, str(hosts), *kept_under_tmp()]
            )  # fmt: skip
        pids = self.shared / "hosts"
        pids.mkdir()
        for i, (name, address) in enumerate(zip(self.names, self.addresses)):
            pid = str(self._holders[name].pid)
            _sh(self._fabric.pid,
                f"ip link add name n{i} type veth peer name eth0 netns {pid}\n"
                f"ip link set n{i} master br0 up")  # fmt: skip
            _sh(int(pid), f"ip addr add {address}/24 dev eth0\nip link set eth0 up")
            (pids / name).write_text(pid)
            (pids / address).write_text(pid)
        self.ssh.write_text(SSH_STAND_IN.format(hosts=pids))
        self.ssh.chmod(0o755)

    def run(self, node: str, argv: Sequence[str], **popen_kwargs) -> subprocess.Popen:
        """``argv`` started inside ``node``'s namespaces (it is in them on return, so that
        ``processes`` and ``kill`` find it)."""
        holder = self._holder_pid(node)
        enter = ["nsenter", "-t", str(holder), "-u", "-m", "-i", "-n", "--"]
        proc = subprocess.Popen([*enter, *argv], **popen_kwargs)
        deadline = time.monotonic() + 10
        while proc.poll() is None and _uts(proc.pid) != _uts(holder):
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError(f"nsenter did not enter {node} in 10 s")
            time.sleep(0.001)
        return proc

    def command(self, argv: Sequence[str], ranks: Sequence[int]) -> list[str]:
        """``mpiexec`` running ``argv`` on ``ranks[i]`` ranks of node ``i``, through ``ssh``."""
        if len(ranks) > len(self.names) or min(ranks, default=0) < 1:
            raise ValueError(f"ranks {list(ranks)} must give 1 or more to each of <= "
                             f"{len(self.names)} nodes")  # fmt: skip
        # The wrapper's own builder (python -m collectives.run uses it): each family's hosts,
        # remote shell and rank placement written in one place.
        hosts = [Host(name, count) for name, count in zip(self.names, ranks)]
        family = mpi_family()
        machinefile = None
        if family == "impi":
            path = self.shared / f"hostfile-{'-'.join(map(str, ranks))}"
            machinefile = write_machinefile(hosts, path)
        return launch_command(
            family, mpiexec(), hosts, argv, remote_shell=str(self.ssh), machinefile=machinefile
        )

    def launch(
        self,
        argv: Sequence[str],
        ranks: Sequence[int],
        env: Mapping[str, str] | None = None,
        **popen_kwargs,
    ) -> subprocess.Popen:
        """The job started on ``node0``, output piped; see ``command``."""
        extra = {"PYTHONUNBUFFERED": "1", "TMPDIR": "/tmp", **(env or {})}
        job_env = launch_env(extra)
        options = dict(
            cwd=REPO, env=job_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip
        options.update(popen_kwargs)
        return self.run(self.names[0], self.command(argv, ranks), **options)

    def job(
        self,
        argv: Sequence[str],
        ranks: Sequence[int],
        env: Mapping[str, str] | None = None,
        timeout: float = 60.0,
    ) -> JobResult:
        """The job run to its end, or killed (with every node's processes) past ``timeout``."""
        start = time.monotonic()
        proc = self.launch(argv, ranks, env)
        try:
            output, _ = proc.communicate(timeout=timeout)
            return JobResult(proc.returncode, output, time.monotonic() - start)
        except subprocess.TimeoutExpired:
            output = self.stop(proc)
            return JobResult(None, output + f"\n[killed after {timeout:.0f} s]", timeout)

    def stop(self, proc: subprocess.Popen) -> str:
        """Every process of every node killed, then ``proc``'s output (a launcher killed
        alone leaves daemons and ranks that hold its output pipe open)."""
        for name in self.names:
            self.kill(name)
        return proc.communicate(timeout=30)[0] or ""

    def processes(self, node: str) -> list[int]:
        """The pids running in ``node`` (its UTS namespace), the holder left out."""
        holder = self._holder_pid(node)
        ns = _uts(holder)
        pids = (int(entry) for entry in os.listdir("/proc") if entry.isdigit())
        return [pid for pid in pids if pid != holder and _uts(pid) == ns]

    def kill(self, node: str) -> None:
        """SIGKILL every process of ``node`` (until none is left: a dying one may fork)."""
        for _ in range(50):
            pids = self.processes(node)
            if not pids:
                return
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.02)
        raise RuntimeError(f"{node}'s processes outlive SIGKILL: {self.processes(node)}")

    def cut(self, node: str) -> None:
        """``node``'s link down at the bridge: its packets are dropped, nothing is reset."""
        self._link(node, "down")

    def mend(self, node: str) -> None:
        """``node``'s link up again."""
        self._link(node, "up")

    def close(self) -> None:
        """Every node's processes killed, holders and the bridge's namespace ended, files gone."""
        for name, holder in self._holders.items():
            if holder.poll() is None:
                self.kill(name)
                holder.kill()
            holder.wait()
        if self._fabric is not None:
            self._fabric.kill()
            self._fabric.wait()
        shutil.rmtree(self.shared, ignore_errors=True)

    def _link(self, node: str, state: str) -> None:
        assert self._fabric is not None
        _sh(self._fabric.pid, f"ip link set n{self.names.index(node)} {state}")

    def _holder_pid(self, node: str) -> int:
        if node not in self._holders:
            raise ValueError(f"no node {node!r}: the nodes are {self.names}")
        return self._holders[node].pid


def _holder(argv: list[str]) -> subprocess.Popen:
    """A process that sets up its namespaces, prints ``ready``, and waits to be killed (by
    ``close``, or by the kernel when this process dies without closing)."""
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_die_with_parent,
    )  # fmt: skip
    assert proc.stdout is not None
    if proc.stdout.readline().strip() != "ready":
        proc.kill()
        _, err = proc.communicate()
        raise RuntimeError(f"a namespace holder could not be made: {err.strip()}")
    return proc


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when its parent dies (``PR_SET_PDEATHSIG``)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def _uts(pid: int) -> int | None:
    """The UTS namespace of ``pid`` (the node it is in), or ``None`` once it is gone."""
    try:
        return os.stat(f"/proc/{pid}/ns/uts").st_ino
    except OSError:
        return None


def _sh(pid: int, script: str) -> None:
    """``script`` run in the network namespace of ``pid``; a failure raises with its output."""
    subprocess.run(
        ["nsenter", "-t", str(pid), "-n", "--", "sh", "-ec", script],
        check=True, capture_output=True, text=True, timeout=30,
    )  # fmt: skip
