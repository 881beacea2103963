"""Whole jobs on the NCCL backend (the emulated CuPy where no GPU is): a host thread that NCCL
holds inside a call past the timeout ends the job, naming the call."""

from __future__ import annotations

import pytest

from tests.emulated_gpu import nccl_job_env
from tests.test_reliability_jobs import _job

NEVER_CONNECTS = """
import time, cupy, collectives as col
comm = col.init(backend="nccl", timeout={timeout})
if comm.rank == 0:
    comm.all_reduce(cupy.ones(4, cupy.float32))   # the first call: NCCL connects to rank 1 here
    print("rank 0 returned from its call", flush=True)
else:
    time.sleep(120)   # never makes a call on comm
"""


@pytest.mark.parametrize("timeout", [2.0])
def test_a_first_call_whose_peer_never_arrives_ends_the_job_naming_it(tmp_path, timeout):
    # NCCL connects to a peer at the first call that needs it, blocking the caller's thread
    # inside NCCL, where no error can reach it: past the timeout the watchdog ends the job.
    proc, elapsed = _job(tmp_path, NEVER_CONNECTS.format(timeout=timeout), 2, nccl_job_env())
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert "rank 0 returned from its call" not in output, output
    assert "CollectiveTimeoutError" in output and "all_reduce #1" in output, output
    assert "still inside NCCL" in output, output
    # timeout + the grace a thread has to leave NCCL + the watchdog's period and the abort;
    # a hang guard, not a performance check (rank 1 sleeps 120 s)
    assert elapsed < timeout + 20, f"the job took {elapsed:.1f} s to end"
