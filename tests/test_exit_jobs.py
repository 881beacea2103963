"""Whole jobs: a non-zero ``sys.exit`` on one rank, and leaving with a failed communicator,
end the job (instead of the others waiting out their timeout, or hanging in MPI_Finalize)."""

from __future__ import annotations

import pytest

from tests.spmd_launcher import mpi_family
from tests.test_reliability_jobs import _job

EXITS_ON_RANK_1 = """
import sys, numpy as np, collectives as col
comm = col.init(backend="mpi", timeout=60, mpi_blocking=False)
comm.all_reduce(np.ones(2))
if comm.rank == 1:
    sys.exit({status!r})
comm.all_reduce(np.ones(4))   # without the abort, rank 0 waits here for 60 s
"""


@pytest.mark.parametrize("status,code", [(3, 3), ("bad input", 1)])
def test_a_non_zero_sys_exit_on_one_rank_ends_the_job_with_its_code(tmp_path, status, code):
    proc, elapsed = _job(tmp_path, EXITS_ON_RANK_1.format(status=status), 2, {})
    output = proc.stdout + proc.stderr
    assert proc.returncode == code, output
    assert elapsed < 20, f"job took {elapsed:.1f} s to end (rank 0's timeout is 60 s)"
    assert output.count(f"[rank 1] sys.exit({status!r}) on one rank of 2") == 1, output


def test_the_same_sys_exit_on_every_rank_ends_the_job_without_an_abort(tmp_path):
    # Every rank leaves at once: no abort, so no rank's last lines can be cut off.
    script = """
import sys, numpy as np, collectives as col
comm = col.init(backend="mpi", timeout=60)
comm.all_reduce(np.ones(2))
print(f"rank {comm.rank} leaves", flush=True)
sys.exit(3)
"""
    proc, _ = _job(tmp_path, script, 3, {})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 3, output
    assert "aborting" not in output, output
    assert all(f"rank {r} leaves" in output for r in range(3)), output


def test_sys_exit_0_on_every_rank_ends_the_job_normally(tmp_path):
    script = "import sys, collectives as col\ncomm = col.init(backend='mpi')\nsys.exit(0)\n"
    proc, _ = _job(tmp_path, script, 2, {})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "aborting" not in proc.stdout + proc.stderr


CAUGHT_TIMEOUT = """
import time, numpy as np, collectives as col
comm = col.init(backend="mpi", timeout=2, mpi_blocking=False)
comm.all_reduce(np.ones(2))
if comm.rank == 0:
    try:
        comm.all_reduce(np.ones(4))   # rank 1 never joins
    except col.CollectiveTimeoutError:
        print("rank 0 caught the timeout", flush=True)
else:
    time.sleep({stuck_for})   # stuck (or only late) outside any call
"""


def test_leaving_with_a_failed_communicator_while_a_rank_is_stuck_aborts(tmp_path):
    proc, elapsed = _job(tmp_path, CAUGHT_TIMEOUT.format(stuck_for=120), 2, {})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 1, output
    assert "rank 0 caught the timeout" in output
    assert "[rank 0] leaving with a failed communicator (all_reduce #2" in output, output
    assert "MPI_Finalize would wait for them forever" in output
    assert elapsed < 30, f"job took {elapsed:.1f} s (rank 1 sleeps 120 s)"


def test_a_call_with_default_settings_on_mpich_raises_its_timeout_in_the_caller(tmp_path):
    # MPICH's calls are non-blocking by default (polled): a stuck one raises in the caller, as
    # the contract has it, with no setting given
    if mpi_family() != "mpich":
        pytest.skip("by default calls are non-blocking on MPICH only")
    script = CAUGHT_TIMEOUT.format(stuck_for=2.5).replace(", mpi_blocking=False", "")
    assert "mpi_blocking" not in script
    env = {"COLLECTIVES_MPI_BLOCKING": ""}  # as if unset
    proc, _ = _job(tmp_path, script, 2, env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "rank 0 caught the timeout" in output and "aborting" not in output


def test_leaving_with_a_failed_communicator_ends_normally_when_every_rank_leaves(tmp_path):
    # rank 1 was only late: it reaches the exit within rank 0's timeout, so nothing hangs
    proc, _ = _job(tmp_path, CAUGHT_TIMEOUT.format(stuck_for=2.5), 2, {})
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    assert "rank 0 caught the timeout" in output and "aborting" not in output


# MPICH's MPI_Abort returns once it has asked the launcher to end the job; a launcher that
# cannot be reached (a node's link cut) never kills the rank. Here every MPI's Abort returns
# without asking, as MPICH's does then: the rank must end itself, with the abort's code.
ABORT_RETURNS = """
from mpi4py import MPI

class ReturningAbort(MPI.Intracomm):
    def Abort(self, errorcode=0):
        print(f"MPI_Abort({{errorcode}}) returned", flush=True)

MPI.COMM_WORLD = ReturningAbort(MPI.COMM_WORLD)
import sys, numpy as np, collectives as col
comm = col.init(backend="mpi", timeout=30, mpi_blocking=False)
comm.all_reduce(np.ones(2))
if comm.rank == 1:
    {leave}
comm.all_reduce(np.ones(4))   # rank 0 waits here: 30 s, unless rank 1's end ends the job
"""


@pytest.mark.parametrize(
    "leave,code",
    [("raise ValueError('fails on purpose')", 1), ("sys.exit(3)", 3)],
    ids=["uncaught", "sys.exit"],
)
def test_a_rank_whose_mpi_abort_returns_ends_itself_with_the_abort_s_code(tmp_path, leave, code):
    proc, elapsed = _job(tmp_path, ABORT_RETURNS.format(leave=leave), 2, {})
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0, output  # the rank's code; Intel MPI's launcher says 255
    assert elapsed < 20, f"job took {elapsed:.1f} s to end (rank 0's timeout is 30 s)"
    assert output.count(f"MPI_Abort({code}) returned") == 1, output
    assert "Exception ignored" not in output, output
