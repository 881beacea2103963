"""All or nothing: once a rank declares a communicator failed, every other rank's next call on
it, and its waits in progress, raise the class of that failure (a timeout is a
``CollectiveTimeoutError`` on every rank) naming it; a late rank never completes a call the
others failed; later calls raise ``CommunicatorStateError``. And with check mode off, ranks that disagree
are caught on the schedule docs/failures.md gives instead of getting wrong numbers forever.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col

WORLD_SIZES = (2,)
SPMD_TIMEOUT = 120


def scheduled(nth: int) -> bool:
    """Whether collective ``nth`` is compared across ranks with check mode off, as
    docs/failures.md says: #1 to #8, then #16, #32, ... #1024, then every 1024th."""
    return nth <= 8 or (nth <= 1024 and nth & (nth - 1) == 0) or nth % 1024 == 0


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_a_late_rank_never_completes_a_call_the_others_failed(async_op):
    comm = col.init("mpi", timeout=1.0, mpi_blocking=False)
    comm.all_reduce(np.ones(2))
    x = np.full(3, comm.rank + 1.0)
    if comm.rank == 0:
        with pytest.raises(col.CollectiveTimeoutError, match="all_reduce #2"):
            comm.all_reduce(x)
        MPI.COMM_WORLD.Barrier()
    else:
        MPI.COMM_WORLD.Barrier()  # arrive after rank 0 has declared the call failed
        with pytest.raises(col.CollectiveTimeoutError) as info:  # the event: a timeout
            work = comm.all_reduce(x, async_op=async_op)
            if async_op:
                work.wait()
        message = str(info.value)
        assert message.startswith("all_reduce: communicator is unusable: rank 0 (world rank 0) ")
        assert "declared it failed: all_reduce #2 (shape (3,), float64) on rank 0" in message
        np.testing.assert_array_equal(x, 2.0)  # never reduced
        with pytest.raises(col.CommunicatorStateError, match="unusable after an earlier error"):
            comm.barrier()
    comm.close()


def test_a_rank_waiting_in_a_call_learns_another_ranks_failure_within_its_timeout():
    # rank 0 times out after 1 s in an all_reduce that rank 1 is not in; rank 1 waits in a
    # recv that rank 0 never sends, with a timeout of 20 s, and is told
    comm = col.init("mpi", timeout=1.0 if comm_rank() == 0 else 20.0, mpi_blocking=False)
    start = time.monotonic()
    if comm.rank == 0:
        with pytest.raises(col.CollectiveTimeoutError):
            comm.all_reduce(np.ones(2))
    else:
        with pytest.raises(col.CollectiveTimeoutError, match="rank 0 .* declared it failed"):
            comm.recv(np.ones(2), 0)
        assert time.monotonic() - start < 10
    MPI.COMM_WORLD.Barrier()
    comm.close()


def comm_rank() -> int:
    return MPI.COMM_WORLD.Get_rank()


def test_ranks_that_disagree_with_check_mode_off_are_caught_on_the_schedule():
    # MPI completes calls whose ranks disagree on the op, with wrong results
    comm = col.init("mpi", timeout=20.0, check=False)
    x = np.ones(4)
    for _ in range(1, 10):  # in step: #1 to #8 are compared, #9 too as it finishes #8
        comm.all_reduce(x)
    first_wrong = 10
    op = "sum" if comm.rank == 0 else "max"  # from #10 on the ranks disagree
    nth = first_wrong
    with pytest.raises(col.CollectiveMismatchError) as info:
        while nth < 100:
            comm.all_reduce(np.ones(4), op=op)
            nth += 1
    first_compared = next(n for n in range(first_wrong, 100) if scheduled(n))
    assert nth == first_compared + 1  # found as the call after it was made, on every rank
    message = str(info.value)
    assert f"at collective #{first_compared} " in message and "op differs" in message, message
    assert f"results of collectives #{first_wrong - 1} and later may be wrong" in message
    comm.all_reduce(x)  # still in step: the refused call was refused on every rank
    comm.close()


@pytest.mark.parametrize("check", [False, True])
@pytest.mark.parametrize("mpi_blocking", [None, True, False])
def test_ranks_may_mix_the_forms_of_a_call(monkeypatch, mpi_blocking, check):
    # Which MPI call a rank makes depends on the communicator's settings only, never on
    # async_op or a group: ranks that mix them meet in the same call, in every setting.
    monkeypatch.delenv("COLLECTIVES_MPI_BLOCKING", raising=False)
    comm = col.init("mpi", timeout=10.0, check=check, mpi_blocking=mpi_blocking)
    for nbytes in (8, 4096, 1 << 20):
        x = np.ones(nbytes // 8)
        if comm.rank == 0:
            comm.all_reduce(x)
        elif comm.rank == 1:
            with comm.group():
                comm.all_reduce(x)
        else:
            comm.all_reduce(x, async_op=True).wait()
        np.testing.assert_array_equal(x, comm.size)
    comm.close()


def test_check_mode_off_compares_the_scheduled_calls_only():
    # A disagreement (MPI completes an all_reduce whose ranks disagree on the op) at calls
    # off the schedule is never caught: those calls cost no comparison. One at a scheduled
    # call, alone, is caught at the next call: every call of the schedule is compared.
    calls = 40
    comm = col.init("mpi", timeout=20.0, check=False)
    for nth in range(1, calls + 1):
        comm.all_reduce(np.ones(4), op="max" if comm.rank == 1 and not scheduled(nth) else "sum")
    comm.close()
    for wrong in [n for n in range(1, calls) if scheduled(n)]:  # 1 to 8, 16, 32
        comm = col.init("mpi", timeout=20.0, check=False)
        nth = 0
        with pytest.raises(col.CollectiveMismatchError) as info:
            for nth in range(1, calls + 1):
                comm.all_reduce(np.ones(4), op="max" if comm.rank == 1 and nth == wrong else "sum")
        assert nth == wrong + 1, (wrong, nth)
        assert f"at collective #{wrong} " in str(info.value), str(info.value)
        comm.close()


def test_an_mpi_error_is_a_library_error_and_ends_the_call_on_every_rank():
    # Check mode off, the ranks disagree on the count: the receivers' MPI reports a truncation
    # (MPICH, Open MPI, Intel MPI's non-blocking broadcast) or truncates silently. Every rank
    # gets a CollectivesError (never mpi4py's MPI.Exception) by its next call. Non-blocking
    # calls: a blocking one that MPI never returns from (Intel MPI's, on some machines, with
    # these counts) cannot end in the process; the watchdog ends the job instead
    # (test_reliability_jobs.py).
    comm = col.init("mpi", timeout=10.0, check=False, mpi_blocking=False)
    x = np.ones(8 if comm.rank == 0 else 4)
    raised_by = None
    with pytest.raises(col.CollectivesError) as info:
        raised_by = "broadcast"
        comm.broadcast(x, root=0)
        raised_by = "all_reduce"
        comm.all_reduce(np.ones(2))
    message = str(info.value)
    if raised_by == "broadcast" and comm.rank == 1:
        assert message.startswith("broadcast: MPI error "), message
        assert "the communicator is unusable" in message
        assert isinstance(info.value.__cause__, MPI.Exception)
    if isinstance(info.value, col.CollectiveMismatchError):
        # where MPI truncated without an error (Intel MPI): the schedule's comparison of
        # collective #1 caught it, at the next call, on every rank alike
        assert raised_by == "all_reduce" and "shape differs" in message, message
        comm.barrier()  # so the ranks are still in step
    else:
        with pytest.raises(col.CommunicatorStateError):
            comm.barrier()  # dead on every rank: nobody goes on as if nothing happened
    MPI.COMM_WORLD.Barrier()
    comm.close()


def test_a_timeout_names_the_ranks_that_issued_the_call_but_wait_in_no_call():
    # As DDP's buckets: every rank issued collective #7; rank 1 then waits in no call (busy,
    # or stopped), so what rank 0 reports (as its timeout would) must name it, not say that
    # every rank reached it.
    comm = col.init("mpi", timeout=20.0)
    for _ in range(6):
        comm.barrier()
    work = comm.all_reduce(np.ones(4, np.float32), async_op=True)  # collective #7
    MPI.COMM_WORLD.Barrier()
    if comm.rank == 0:
        report = comm.progress_report()
        assert "Every rank on this node has reached collective #7." in report, report
        assert (
            "Ranks that have issued collective #7 but wait in no call (stopped, or busy "
            "outside the library): rank 1." in report
        ), report
    MPI.COMM_WORLD.Barrier()
    work.wait()
    comm.close()
