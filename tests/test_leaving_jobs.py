"""Whole jobs: a rank that leaves normally while the others still call collectives ends the
job naming its exit (instead of the others waiting out their timeout), and a child forked
from a rank can neither use the parent's communicator nor end the job by leaving."""

from __future__ import annotations

import pytest

from tests.test_reliability_jobs import _job

EXITS_0_ON_RANK_1 = """
import sys, numpy as np, collectives as col
comm = col.init(backend="mpi", timeout=60{settings})
comm.all_reduce(np.ones(2))
if comm.rank == 1:
    sys.exit(0)
comm.all_reduce(np.ones({count}))   # rank 1 never makes it: 60 s of waiting, before
"""


@pytest.mark.parametrize(
    "settings,count",
    [("", 4), (", mpi_blocking=False", 4), (", mpi_blocking=True", 1 << 18)],
    ids=["default", "non-blocking", "blocking-256k"],
)
def test_sys_exit_0_on_one_rank_ends_the_job_naming_it(tmp_path, settings, count):
    script = EXITS_0_ON_RANK_1.format(settings=settings, count=count)
    proc, elapsed = _job(tmp_path, script, 2, {})
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output
    assert elapsed < 20, f"job took {elapsed:.1f} s to end (rank 0's timeout is 60 s)"
    # rank 0's error (it waits in a call), or rank 1's abort (rank 0 inside a blocking call)
    assert (
        "rank 1 (world rank 1) left the program (sys.exit(0)) after collective #1" in output
        or "[rank 1] left the program (sys.exit(0)) while rank 0 is inside a blocking "
        "all_reduce at collective #2"
        in output
    ), output


def test_ranks_that_leave_at_different_times_end_the_job_normally(tmp_path):
    # rank 0 works on after the last collective (longer than the grace at the exit): rank
    # 1's notice that it left must not fail rank 0, which makes no call after it
    script = """
import time, numpy as np, collectives as col
comm = col.init(backend="mpi", timeout=60)
comm.all_reduce(np.ones(2))
if comm.rank == 0:
    time.sleep(3)
    comm.close()
print(f"rank {comm.rank} leaves", flush=True)
"""
    proc, elapsed = _job(tmp_path, script, 2, {})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "aborting" not in output and "Error" not in output, output
    assert all(f"rank {r} leaves" in output for r in range(2)), output


FORKS_ON_RANK_0 = """
import os, sys, numpy as np, collectives as col
comm = col.init(backend="mpi", timeout=20)
x = np.ones(2)
comm.all_reduce(x)
if comm.rank == 0:
    pid = os.fork()
    if pid == 0:
        try:
            comm.all_reduce(np.full(2, 100.0))
            print("child: all_reduce completed", flush=True)
        except col.CommunicatorStateError as e:
            print(f"child refused: {{e}}", flush=True)
        comm.close()
        sys.exit({code})
    _, status = os.waitpid(pid, 0)
    print(f"child exit code {{os.waitstatus_to_exitcode(status)}}", flush=True)
comm.all_reduce(x)
print(f"rank {{comm.rank}} got {{x.tolist()}}", flush=True)
"""


@pytest.mark.parametrize("code", [0, 4])
def test_a_forked_child_is_refused_and_its_exit_leaves_the_job_intact(tmp_path, code):
    proc, elapsed = _job(tmp_path, FORKS_ON_RANK_0.format(code=code), 2, {})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "child refused: all_reduce: communicator belongs to process" in output, output
    assert "is a child forked from it: MPI cannot be used in a forked child" in output
    assert f"child exit code {code}" in output, output
    assert "rank 0 got [4.0, 4.0]" in output and "rank 1 got [4.0, 4.0]" in output, output
    assert elapsed < 15, f"job took {elapsed:.1f} s"
