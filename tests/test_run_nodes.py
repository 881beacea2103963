"""A job that outlives a node: ``python -m collectives.run`` on 3 emulated nodes
(``tests/nodes.py``). The GPT example, one node killed mid-run: the job finishes on the 2
left, resumed from the newest complete checkpoint resharded to the smaller mesh, with the
losses of a run started on those 2 nodes from that checkpoint. A node's link cut: the
launcher, which hangs, is ended and the job finishes on the 2 left. Skipped where nodes
cannot be made (not root, no ``unshare``)."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.nodes import Nodes, skip_unless_available
from tests.spmd_launcher import REPO, launch_env, mpi_family

STEPS, SAVE_EVERY = 10, 4
#: ZeRO-1 shards the optimizer state over dp: 3 ranks before the loss, 2 after
GPT = [sys.executable, str(REPO / "examples" / "gpt_3d.py"), "--tp", "2", "--zero", "1", "--global-batch", "12",
       "--microbatches", "2", "--steps", str(STEPS)]  # fmt: skip
STEP = re.compile(r"^step (\d+) loss (\S+)$")


def unreachable(nodes: Nodes, node: str) -> None:
    """The ssh stand-in refuses ``node`` from now on, as ssh fails to reach a dead host (the
    stand-in enters a node by the files named after it, with no network between)."""
    for name in (node, nodes.addresses[nodes.names.index(node)]):
        (nodes.shared / "hosts" / name).unlink()


def start_wrapper(nodes: Nodes, options: list[str], command: list[str]) -> subprocess.Popen:
    """``python -m collectives.run`` on node0 (over every node, unless ``options`` name the
    hosts), output piped (text)."""
    hosts = [] if "--hosts" in options else ["--hosts", ",".join(nodes.names)]
    forward = [] if mpi_family() != "openmpi" else ["--launcher-args", "-x PYTHONPATH"]
    extra = {"PYTHONUNBUFFERED": "1", "TMPDIR": "/tmp", "PYTHONPATH": str(REPO)}
    env = launch_env(extra)
    return nodes.run(
        "node0",
        [sys.executable, "-m", "collectives.run", *hosts,
         "--remote-shell", str(nodes.ssh), *forward, *options, "--", *command],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )  # fmt: skip


class Lines:
    """The lines a process writes, each with the time it was read, gathered by a thread."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: list[tuple[float, str]] = []
        self._proc = proc
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.lines.append((time.monotonic(), line.rstrip("\n")))

    def wait_for(self, pattern: str, timeout: float) -> float:
        """When the first line matching ``pattern`` was read (an error if none came)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ended = self._proc.poll() is not None
            for at, line in list(self.lines):
                if re.search(pattern, line):
                    return at
            if ended and not self._thread.is_alive():
                break
            time.sleep(0.02)
        raise AssertionError(f"no line matched {pattern!r}:\n{self.text()}")

    def text(self) -> str:
        return "\n".join(line for _, line in self.lines)

    def finish(self, timeout: float = 10.0) -> None:
        """Wait for the last lines (after the process ended), as long as ``timeout``."""
        self._thread.join(timeout)


def losses(lines: list[str]) -> dict[int, float]:
    return {int(m[1]): float(m[2]) for m in map(STEP.match, lines) if m}


@pytest.fixture(scope="module", autouse=True)
def nodes_available():
    skip_unless_available()


def test_each_host_runs_the_ranks_given_it_in_order():
    with Nodes(3) as nodes:
        wrapper = start_wrapper(
            nodes, ["--hosts", "node2:1,node0:2,node1:1"],
            ["sh", "-c", "echo rank ${PMI_RANK:-$OMPI_COMM_WORLD_RANK} on $(hostname)"],
        )  # fmt: skip
        output, _ = wrapper.communicate(timeout=120)
    assert wrapper.returncode == 0, output
    ranks = sorted(line for line in output.splitlines() if line.startswith("rank "))
    assert ranks == ["rank 0 on node2", "rank 1 on node0", "rank 2 on node0", "rank 3 on node1"]


def test_the_gpt_example_outlives_a_node_and_resumes_on_the_two_left():
    with Nodes(3) as nodes:
        ckpt = nodes.shared / "ckpt"
        wrapper = start_wrapper(
            nodes,
            ["--ranks-per-host", "2", "--max-restarts", "1", "--min-hosts", "2", "--watch", "1",
             "--grace", "5", "--resume-arg", f"--resume {ckpt}"],
            [*GPT, "--dp", "{nodes}", "--save", str(ckpt), "--save-every", str(SAVE_EVERY)],
        )  # fmt: skip
        out = Lines(wrapper)
        try:
            out.wait_for(rf"^step {SAVE_EVERY} loss", timeout=120)  # step-4 is complete
            unreachable(nodes, "node2")  # first: the launcher may end, and the probe run, at once
            killed = time.monotonic()
            nodes.kill("node2")
            wrapper.wait(timeout=120)
        finally:
            if wrapper.poll() is None:
                wrapper.kill()
        out.finish()
        restarted = out.wait_for(r"restart 1 of 1 on node0:2,node1:2", timeout=5)
        output = out.text()
        assert wrapper.returncode == 0, output
        after = [line for at, line in out.lines if at > restarted]
        resumed = losses(after)
        start = min(resumed)
        training_again = next(at for at, line in out.lines if at > restarted and STEP.match(line))
        assert start in (SAVE_EVERY, 2 * SAVE_EVERY) and sorted(resumed) == list(
            range(start, STEPS)
        )
        assert "hosts gone: node2" in output and "the job succeeded after 1 restart" in output

        # the same checkpoint, loaded by a run started on the 2 nodes left
        reference = nodes.job(
            [*GPT, "--dp", "2", "--resume", str(ckpt / f"step-{start:08d}")], ranks=[2, 2],
            env={"PYTHONPATH": str(REPO)}, timeout=120,
        )  # fmt: skip
        assert reference.returncode == 0, reference.output
        expected = losses(reference.output.splitlines())
        assert sorted(expected) == sorted(resumed)
        for step in expected:
            assert resumed[step] == pytest.approx(expected[step], rel=1e-9, abs=0), step
    print("\n".join(line for _, line in out.lines if not STEP.match(line)))
    print(
        f"killed to training again: {training_again - killed:.2f} s, of which "
        f"{restarted - killed:.2f} s to the restart (the job's end, the probe) and "
        f"{training_again - restarted:.2f} s to the first step resumed (at step {start})"
    )


#: all-reduces until a restart, then 3 more; the library's timeout (60 s) outlasts the test's
#: waits, so that the wrapper, not the ranks, ends the run whose link was cut
STEPS_UNTIL_RESTART = """
import os, time
import collectives as col

restart = int(os.environ["COLLECTIVES_RESTART_COUNT"])
comm = col.init("mpi", timeout=60)
x = comm.xp.ones(1)
for step in range(600 if restart == 0 else 3):
    comm.all_reduce(x)
    if comm.rank == 0:
        print(f"run {restart} size {comm.size} step {step}", flush=True)
    time.sleep(0.05)
comm.close()
"""


def _environ(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return b""


def test_a_cut_link_is_outlived_and_the_first_run_leaves_nothing_behind():
    """A cut link hangs the launchers (every rank blocked, no connection reset): the watch
    finds the host silent and ends the launcher after --grace (Open MPI's ignores SIGTERM:
    SIGKILL 5 s later); what it started on node0 goes with it."""
    grace = 2.0
    with Nodes(3) as nodes:
        job = nodes.shared / "job.py"
        job.write_text(STEPS_UNTIL_RESTART)
        wrapper = start_wrapper(
            nodes, ["--max-restarts", "1", "--watch", "0.5", "--grace", str(grace)],
            [sys.executable, str(job)],
        )  # fmt: skip
        out = Lines(wrapper)
        try:
            out.wait_for(r"^run 0 size 3 step 3$", timeout=120)
            unreachable(nodes, "node2")
            cut = time.monotonic()
            nodes.cut("node2")
            restarted = out.wait_for(r"restart 1 of 1 on node0:1,node1:1", timeout=60)
            left = [p for p in nodes.processes("node0")
                    if b"COLLECTIVES_RESTART_COUNT=0" in _environ(p)]  # fmt: skip
            wrapper.wait(timeout=120)
        finally:
            if wrapper.poll() is None:
                wrapper.kill()
        out.finish()
    output = out.text()
    assert wrapper.returncode == 0, output
    assert "host node2 stopped answering the probe" in output
    assert f"the launcher runs on {grace:g} s after a host was lost: sent SIGTERM" in output
    assert "run 1 size 2 step 2" in output and "the job succeeded after 1 restart" in output
    assert left == [], output
    # the watch's period, the grace, SIGKILL's 5 s, the probe and the launcher's exit
    assert restarted - cut < 0.5 + grace + 5 + 5, output
    print(f"\ncut to the restart: {restarted - cut:.2f} s")
