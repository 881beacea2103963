"""Whole-job behaviour: abort on an uncaught exception, the timeline files and their merge."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.spmd_launcher import REPO, mpi_env, mpiexec

RAISES_ON_RANK_1 = """
import collectives as col, numpy as np
comm = col.init(backend="mpi", timeout={timeout})
if comm.rank == 1:
    raise {error}("rank 1 fails on purpose")
comm.all_reduce(np.ones(4))   # without the abort, rank 0 waits here until the timeout
"""


def _job(tmp_path: Path, script: str, size: int, env: dict, timeout: float = 60):
    path = tmp_path / "job.py"
    path.write_text(script)
    start = time.monotonic()
    with mpi_env(env) as job_env:
        proc = subprocess.run(
            [mpiexec(), "-n", str(size), sys.executable, str(path)],
            cwd=REPO,
            env=job_env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    return proc, time.monotonic() - start


def _raising_job(tmp_path: Path, error: str, env: dict, timeout: float = 60):
    script = RAISES_ON_RANK_1.format(error=error, timeout=timeout)
    proc, elapsed = _job(tmp_path, script, 2, env)
    return proc, proc.stdout + proc.stderr, elapsed


@pytest.mark.parametrize("setting", ["", "1"], ids=["default", "on"])  # "": as if unset
def test_uncaught_exception_aborts_the_whole_job(tmp_path, setting):
    env = {"COLLECTIVES_ABORT_ON_EXCEPTION": setting}
    proc, output, elapsed = _raising_job(tmp_path, "RuntimeError", env)
    assert proc.returncode != 0
    assert elapsed < 15, f"job took {elapsed:.1f} s to end (rank 0's timeout is 60 s)"
    assert output.count("RuntimeError: rank 1 fails on purpose") == 1, output
    assert output.count("[rank 1] uncaught exception, aborting the job") == 1, output


def test_keyboard_interrupt_is_reported_once_and_aborts(tmp_path):
    proc, output, elapsed = _raising_job(tmp_path, "KeyboardInterrupt", {})
    assert proc.returncode != 0
    assert elapsed < 15, f"job took {elapsed:.1f} s to end"
    assert output.count("KeyboardInterrupt: rank 1 fails on purpose") == 1, output
    assert output.count("[rank 1] interrupted, aborting the job") == 1, output


def test_abort_on_exception_can_be_turned_off(tmp_path):
    # Off, rank 0 is left to its own timeout, which then ends it with a clear error (raised:
    # non-blocking calls, as a blocking one would be ended by the watchdog's abort).
    env = {"COLLECTIVES_ABORT_ON_EXCEPTION": "0", "COLLECTIVES_MPI_BLOCKING": "0"}
    proc, output, elapsed = _raising_job(tmp_path, "RuntimeError", env, timeout=3)
    assert "aborting the job" not in output
    assert "CollectiveTimeoutError" in output, output
    assert elapsed >= 3


#: elements of float64 of the calls that get stuck
LARGE = 256

# A rank that never makes the next call but keeps MPI progressing what it has posted: Open
# MPI finishes the overlapped check of the last call only with the peer's progress, and a
# rank asleep outside MPI would make the others time out in that check, not in the call.
STUCK_BUT_PROGRESSING = """if comm.rank == {rank}:
    end = time.monotonic() + 60
    while time.monotonic() < end:
        MPI.COMM_WORLD.Iprobe()
        time.sleep(0.01)
"""


def test_a_stuck_blocking_call_ends_the_job_after_its_timeout(tmp_path):
    # A blocking MPI call cannot be interrupted: the watchdog prints the error and aborts.
    script = f"""
import time, numpy as np, collectives as col
from mpi4py import MPI
comm = col.init(backend="mpi", timeout=1.5, mpi_blocking=True)
comm.all_reduce(np.ones(3))
{STUCK_BUT_PROGRESSING.format(rank=1)}comm.all_reduce(np.ones({LARGE}))
"""
    env = {"COLLECTIVES_ABORT_ON_EXCEPTION": "0"}  # the watchdog alone ends it
    proc, elapsed = _job(tmp_path, script, 2, env)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert elapsed < 15, f"job took {elapsed:.1f} s to end (rank 1 sleeps 60 s)"
    assert (
        f"[rank 0] CollectiveTimeoutError: all_reduce #2 (shape ({LARGE},), float64) on rank 0 "
        "did not complete after 1." in output
    ), output
    assert "Ranks that have not reached collective #2: rank 1 (at collective #1)" in output
    assert "aborting the job" in output


@pytest.mark.parametrize("call", ["all_reduce", "broadcast", "all_gather"])
def test_a_timeout_names_the_ranks_inside_a_blocking_call(tmp_path, call):
    # Ranks 0 and 1 are inside the blocking call #2, rank 2 (the root) never makes it: the
    # watchdog's message says which ranks are inside it, from what they posted beforehand.
    args = f"np.ones({LARGE}), root=2" if call == "broadcast" else f"np.ones({LARGE})"
    script = f"""
import time, numpy as np, collectives as col
from mpi4py import MPI
# Rank 0 alone times out first (two ranks aborting at once may lose each other's message).
timeout = 1.5 if MPI.COMM_WORLD.Get_rank() == 0 else 30.0
comm = col.init(backend="mpi", timeout=timeout, mpi_blocking=True)
comm.all_reduce(np.ones(3))
{STUCK_BUT_PROGRESSING.format(rank=2)}comm.{call}({args})
"""
    env = {"COLLECTIVES_ABORT_ON_EXCEPTION": "0"}  # the watchdog alone ends it
    proc, elapsed = _job(tmp_path, script, 3, env)
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert elapsed < 20, f"job took {elapsed:.1f} s to end (rank 2 sleeps 60 s)"
    assert f"[rank 0] CollectiveTimeoutError: {call} #2 (shape ({LARGE},), float64)" in output, (
        output
    )
    assert f"rank 1 is inside a blocking {call} at collective #2" in output, output
    assert f"rank 0 (this one) is inside a blocking {call} at collective #2" in output, output
    assert "rank 2 waits in no call at collective #1" in output, output
    assert "but wait in no call" not in output, output


def test_timeline_files_and_merge(tmp_path):
    script = """
import collectives as col, numpy as np
from ddp import DistributedDataParallel
comm = col.init("mpi")
for _ in range(3):
    comm.all_reduce(np.ones(8))
ddp = DistributedDataParallel({"w": np.ones(4), "b": np.ones(2)}, comm, bucket_cap_mb=1e-5,
                              first_bucket_cap_mb=1e-5)
ddp.zero_grad()
ddp.finish()
comm.close()
"""
    base = tmp_path / "trace"
    proc, _ = _job(tmp_path, script, 2, {"COLLECTIVES_TIMELINE": str(base)})
    assert proc.returncode == 0, proc.stderr
    files = sorted(str(p) for p in tmp_path.glob("trace.rank*.json"))
    assert len(files) == 2
    merged = tmp_path / "all.json"
    run = subprocess.run(
        [sys.executable, "-m", "collectives.timeline", "merge", "-o", str(merged), *files],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    events = json.loads(merged.read_text())["traceEvents"]
    spans = [e for e in events if e["ph"] == "X"]
    assert sorted({e["pid"] for e in spans}) == [0, 1]
    assert sum(e["name"] == "all_reduce" and e["args"]["bytes"] == 64 for e in spans) == 6
    buckets = [e for e in spans if e["name"].startswith("bucket ")]
    assert sorted(e["name"] for e in buckets) == ["bucket 0", "bucket 0", "bucket 1", "bucket 1"]
    names = {e["args"]["name"] for e in events if e["ph"] == "M"}
    assert {"rank 0", "rank 1", "ddp buckets"} <= names


def test_ctrl_c_interrupts_a_waiting_collective(tmp_path):
    script = tmp_path / "wait.py"
    script.write_text("""
import signal, sys, numpy as np, collectives as col
signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a terminal
comm = col.init("mpi", timeout=60)
print("waiting", flush=True)
try:
    with comm.group():
        comm.recv(np.empty(2), 0)   # nothing ever sends
except KeyboardInterrupt:
    print("interrupted", flush=True)
    sys.exit(3)
""")
    proc = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout.readline().strip() == "waiting"
    time.sleep(0.5)
    start = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 3, err
    assert "interrupted" in out
    assert time.monotonic() - start < 10  # not the 60 s timeout
