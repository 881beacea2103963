"""Whole-job behaviour: abort on an uncaught exception, the timeline files and their merge."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.spmd_launcher import REPO, mpi_env, mpiexec

RAISES_ON_RANK_1 = """
import collectives as col, numpy as np
comm = col.init(timeout=60)
if comm.rank == 1:
    raise RuntimeError("rank 1 fails on purpose")
comm.all_reduce(np.ones(4))   # without the hook, rank 0 would wait here for 60 s
"""


def _job(tmp_path: Path, script: str, size: int, env: dict, timeout: float = 60):
    path = tmp_path / "job.py"
    path.write_text(script)
    start = time.monotonic()
    proc = subprocess.run(
        [mpiexec(), "-n", str(size), sys.executable, str(path)],
        cwd=REPO,
        env=mpi_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, time.monotonic() - start


def test_uncaught_exception_aborts_the_whole_job(tmp_path):
    proc, elapsed = _job(tmp_path, RAISES_ON_RANK_1, 2, {"COLLECTIVES_ABORT_ON_EXCEPTION": "1"})
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert elapsed < 15, f"job took {elapsed:.1f} s to end"
    assert output.count("RuntimeError: rank 1 fails on purpose") == 1, output
    assert "[rank 1] uncaught exception, aborting the job" in output


def test_timeline_files_and_merge(tmp_path):
    script = """
import collectives as col, numpy as np
from ddp import DistributedDataParallel
comm = col.init()
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
comm = col.init(timeout=60)
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
