"""A job that outlives a node: ``python -m collectives.run`` runs the GPT example on 3
emulated nodes (``tests/nodes.py``), one of which is killed mid-run; the job finishes on the
2 left, resumed from the newest complete checkpoint resharded to the smaller mesh, with the
losses of a run started on those 2 nodes from that checkpoint. Skipped where nodes cannot be
made (not root, no ``unshare``). About 30 s under MPICH on 2 cores."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time

import pytest

from tests.nodes import Nodes, skip_unless_available
from tests.spmd_launcher import REPO, launch_env, mpi_family

STEPS, SAVE_EVERY = 10, 4
#: ZeRO-1 shards the optimizer state over dp: 3 ranks before the loss, 2 after
GPT = [sys.executable, str(REPO / "examples" / "gpt_3d.py"), "--tp", "2", "--zero", "1", "--global-batch", "12",
       "--microbatches", "2", "--steps", str(STEPS)]  # fmt: skip
STEP = re.compile(r"^step (\d+) loss (\S+)$")


def lose(nodes: Nodes, node: str) -> None:
    """``node`` is gone: its processes killed, and the ssh stand-in refuses it from now on
    (it finds a node by the files named after it, as ssh resolves a host name)."""
    nodes.kill(node)
    for name in (node, nodes.addresses[nodes.names.index(node)]):
        (nodes.shared / "hosts" / name).unlink()


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


def losses(lines: list[str]) -> dict[int, float]:
    return {int(m[1]): float(m[2]) for m in map(STEP.match, lines) if m}


@pytest.fixture(scope="module", autouse=True)
def nodes_available():
    skip_unless_available()


def test_the_gpt_example_outlives_a_node_and_resumes_on_the_two_left():
    forward = [] if mpi_family() != "openmpi" else ["--launcher-args", "-x PYTHONPATH"]
    env = launch_env({"PYTHONUNBUFFERED": "1", "TMPDIR": "/tmp", "PYTHONPATH": str(REPO)})
    with Nodes(3) as nodes:
        ckpt = nodes.shared / "ckpt"
        wrapper = nodes.run(
            "node0",
            [sys.executable, "-m", "collectives.run", "--hosts", ",".join(nodes.names),
             "--ranks-per-host", "2", "--remote-shell", str(nodes.ssh), "--max-restarts", "1",
             "--min-hosts", "2", "--watch", "1", "--grace", "5", *forward,
             "--resume-arg", f"--resume {ckpt}", "--", *GPT, "--dp", "{nodes}",
             "--save", str(ckpt), "--save-every", str(SAVE_EVERY)],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            start_new_session=True,
        )  # fmt: skip
        out = Lines(wrapper)
        try:
            out.wait_for(rf"^step {SAVE_EVERY} loss", timeout=120)  # step-4 is complete
            lose(nodes, "node2")
            killed = time.monotonic()
            wrapper.wait(timeout=120)
        finally:
            if wrapper.poll() is None:
                wrapper.kill()
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
    print(
        f"\nkilled to training again: {training_again - killed:.2f} s, of which "
        f"{restarted - killed:.2f} s to the restart (the job's end, the probe) and "
        f"{training_again - restarted:.2f} s to the first step resumed (at step {start})"
    )
