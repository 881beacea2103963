"""All or nothing: once a rank declares a communicator failed, every other rank's next call on
it, and its waits in progress, raise the class of that failure (a timeout is a
``CollectiveTimeoutError`` on every rank) naming it; a late rank never completes a call the
others failed; later calls raise ``CommunicatorStateError``. And with check mode off, ranks that disagree
are caught on a schedule (``collectives._guard``) instead of getting wrong numbers forever.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col
from collectives._guard import scheduled

WORLD_SIZES = (2,)
SPMD_TIMEOUT = 120


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


def test_check_mode_off_costs_no_comparison_between_scheduled_calls():
    comm = col.init("mpi", timeout=20.0, check=False)
    guard = comm._books.checker
    compared = []
    original = guard.checker.post
    guard.checker.post = lambda nth, *args: (compared.append(nth), original(nth, *args))
    for _ in range(40):
        comm.all_reduce(np.ones(1))
    assert compared == [1, 2, 3, 4, 5, 6, 7, 8, 16, 32]
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
    # As DDP's buckets: every rank issued collective #1; rank 1 then stops waiting (busy, or
    # stopped), so the timeout on rank 0 must name it, not say that every rank reached it.
    comm = col.init("mpi", timeout=20.0)
    board = comm._progress
    board.slots[board.local_rank] = 7  # as after issuing collective #7
    comm.mpi_comm.Barrier()
    if comm.rank == 0:
        board.waiting("all_reduce (shape (4,), float32)")
        report = comm.progress_report()
        assert "Every rank on this node has reached collective #7." in report
        assert (
            "Ranks that have issued collective #7 but wait in no call (stopped, or busy "
            "outside the library): rank 1." in report
        ), report
        board.done_waiting()
    comm.mpi_comm.Barrier()
    comm.close()


@pytest.mark.parametrize(
    "call", ["all_reduce", "all_reduce_avg", "all_reduce_out", "reduce", "broadcast"]
)
def test_a_call_above_the_count_one_mpi_call_takes_is_made_in_parts(monkeypatch, call, backend, xp):
    # As with 2**31 elements where counts are C ints (Open MPI 5), at a limit of 5 elements
    from collectives import _mpi

    monkeypatch.setattr(_mpi, "MAX_COUNT", 5)
    comm = col.init(backend, timeout=20.0)
    if comm.backend != "mpi":
        comm.close()
        pytest.skip("the parts are the MPI backend's")
    size, rank = comm.size, comm.rank
    mine = np.arange(23.0).reshape(23, 1) * (rank + 1)
    x = xp.asarray(mine)
    total = np.arange(23.0).reshape(23, 1) * size * (size + 1) / 2
    if call == "all_reduce":
        got, want = comm.all_reduce(x, async_op=True).wait(), total
    elif call == "all_reduce_avg":
        got, want = comm.all_reduce(x, op="avg", async_op=True).wait(), total / size
    elif call == "all_reduce_out":
        got = comm.all_reduce(x, out=xp.empty_like(x), async_op=True).wait()
        want = total
        np.testing.assert_array_equal(x.get() if hasattr(x, "get") else x, mine)  # x unchanged
    elif call == "reduce":
        got, want = comm.reduce(x, root=size - 1, async_op=True).wait(), total
        if rank != size - 1:
            want = mine
    else:
        got, want = comm.broadcast(x, root=0, async_op=True).wait(), np.arange(23.0).reshape(23, 1)
    np.testing.assert_array_equal(got.get() if hasattr(got, "get") else got, want)
    assert [c["state"] for c in comm.flight_record()] == ["completed"]
    comm.close()
