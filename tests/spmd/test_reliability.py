"""Timeouts, check mode and the flight recorder, across real ranks.

Every communicator is made on the backend under test (the ``backend`` fixture) and every
array is of its module (``xp``); the tests of the MPI backend's calls on NumPy arrays are
marked ``numpy_only``.

White-box in one place on purpose (one of the few test modules that reach private names):
``with_checks_over(comm, "mpi")`` puts check mode on the comparison over MPI that ranks on
several nodes make, where a one-machine job would compare over the node's shared memory;
nothing public chooses it. Everything else here goes through the public API.
"""

from __future__ import annotations

import gc
import json
import time
import weakref

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col
from tests.short_timeout import init_with_short_timeout, warm_up_counts

WORLD_SIZES = (2, 3)
#: with check mode off, collectives #1 to #8 are all compared across ranks (docs/failures.md)
EVERY_CALL_UNTIL = 8

# Timeouts raised in the caller need non-blocking MPI calls (mpi_blocking=False): a blocking
# one cannot be interrupted, and ends the job instead (tests/test_reliability_jobs.py).


def host(a) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy array."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


def finished(comm, call: str, *args, **kwargs):
    """Make ``call`` and return once it has completed on this rank (or raise): a synchronous
    call, except on NCCL, where a synchronous call returns once it is queued on the device, so
    there the call is made with ``async_op=True`` and its Work synchronized."""
    if comm.backend == "nccl":
        return getattr(comm, call)(*args, async_op=True, **kwargs).synchronize()
    return getattr(comm, call)(*args, **kwargs)


def test_stuck_collective_times_out_naming_call_and_missing_ranks(
    tmp_path, monkeypatch, backend, xp
):
    monkeypatch.setenv("COLLECTIVES_FLIGHT_RECORDER", str(tmp_path))
    comm = init_with_short_timeout(backend, 1.0, mpi_blocking=False)
    calls, collectives = warm_up_counts(comm)  # made before the test's own calls
    x = xp.ones(3)
    finished(comm, "all_reduce", x)
    if comm.rank == 0:
        start = time.monotonic()
        with pytest.raises(col.CollectiveTimeoutError) as info:
            finished(comm, "all_reduce", x)
        waited = time.monotonic() - start
        assert 1.0 <= waited < 30.0  # after the timeout, and long before the launch's limit
        message = str(info.value)
        assert f"all_reduce #{calls + 2}" in message and "shape (3,)" in message
        missing = ", ".join(
            f"rank {r} (at collective #{collectives + 1})" for r in range(1, comm.size)
        )
        assert f"Ranks that have not reached collective #{collectives + 2}: {missing}" in message
        with pytest.raises(col.CommunicatorStateError, match="unusable after an earlier error"):
            comm.broadcast(x)
        states = [c["state"] for c in comm.flight_record()]
        assert states[calls:] == ["completed", "timed out"]
        dumped = json.loads((tmp_path / "flight-recorder.rank0.json").read_text())
        assert [(c["seq"], c["call"], c["state"]) for c in dumped["calls"]][calls:] == [
            (calls + 1, "all_reduce", "completed"),
            (calls + 2, "all_reduce", "timed out"),
        ]
    comm.close()


def test_timeout_says_what_each_rank_of_the_node_is_doing():
    # rank 1 skipped the collective and waits in a recv; rank 2 (at 3 ranks) is in no call
    comm = col.init(backend="mpi", timeout=1.0 if _rank() == 0 else 3.0, mpi_blocking=False)
    x = np.ones(3)
    comm.all_reduce(x)
    if comm.rank == 0:
        with pytest.raises(col.CollectiveTimeoutError) as info:
            comm.all_reduce(x)
        message = str(info.value)
        assert (
            "rank 0 (this one) waits in all_reduce (shape (3,), float64) at collective #2"
            in message
        )
        assert "rank 1 waits in recv (shape (2,), int32) at collective #1" in message, message
        if comm.size > 2:
            assert "rank 2 waits in no call at collective #1" in message, message
    elif comm.rank == 1:  # told by rank 0, before its own timeout of 3 s: a timeout too
        start = time.monotonic()
        with pytest.raises(col.CollectiveTimeoutError, match="rank 0 .world rank 0. declared"):
            comm.recv(np.empty(2, np.int32), 0)
        assert time.monotonic() - start < 2.5
    MPI.COMM_WORLD.Barrier()  # rank 2 stays in no call until the others have timed out
    comm.close()


def _rank() -> int:
    return MPI.COMM_WORLD.Get_rank()


def test_timeout_on_point_to_point_names_recv(backend, xp):
    comm = init_with_short_timeout(backend, 0.5, mpi_blocking=False)
    first = warm_up_counts(comm)[0] + 1
    if comm.rank == 1:
        with pytest.raises(
            col.CollectiveTimeoutError, match=rf"recv #{first} \(shape \(2,\), int32\)"
        ):
            finished(comm, "recv", xp.empty(2, np.int32), 0)
    comm.close()


MISMATCHES = {
    "op": (lambda c, x: c.all_reduce(x, op="max" if c.rank else "sum"), "op differs"),
    "shape": (lambda c, x: c.all_reduce(x[: 1 + c.rank].copy()), "shape differs"),
    "dtype": (lambda c, x: c.all_reduce(x.astype(np.float32) if c.rank else x), "dtype differs"),
    "root": (lambda c, x: c.broadcast(x, root=min(c.rank, 1)), "root differs"),
    "call": (lambda c, x: c.all_reduce(x) if c.rank else c.broadcast(x), "call differs"),
    "skipped": (None, None),
}


def with_checks_over(comm, path: str):
    """Check over the node's shared memory (the default on one node), or over MPI (as when
    ranks span nodes)."""
    from collectives._safety.check import Checker

    guard = comm._books.checker
    if path == "mpi":
        guard.checker.close()
        guard.checker = Checker(comm, guard.fail, guard.checker.requests, shared_memory=False)
        assert guard.checker._board is None
    else:
        assert guard.checker._board is not None
    return comm


@pytest.mark.parametrize("path", ["board", "mpi"])
@pytest.mark.parametrize("kind", sorted(MISMATCHES))
def test_check_mode_catches_mismatch_on_every_rank(kind, path, backend, xp):
    call, expected = MISMATCHES[kind]
    comm = with_checks_over(col.init(backend, check=True, timeout=5.0, mpi_blocking=False), path)
    x = xp.arange(4.0)
    comm.all_reduce(x)  # a matching call passes
    np.testing.assert_array_equal(host(x), np.arange(4.0) * comm.size)
    if kind == "skipped":
        # Rank 0 skips a barrier: its next call meets the others' barrier.
        with pytest.raises(col.CollectiveMismatchError) as info:
            if comm.rank == 0:
                comm.all_reduce(x)
            else:
                comm.barrier()
        assert "call differs (rank 0: all_reduce, rank 1: barrier" in str(info.value)
    else:
        with pytest.raises(col.CollectiveMismatchError) as info:
            call(comm, x)
        message = str(info.value)
        assert expected in message
        assert "rank 0:" in message and "rank 1:" in message
    comm.close()


def test_check_mode_and_progress_board_number_collectives_apart_from_point_to_point(backend, xp):
    """Ranks 0 and 1 exchange messages the others do not make: their next collectives still
    match in check mode, and a stuck one reports by collective, not by call."""
    comm = init_with_short_timeout(backend, 1.5, check=True, mpi_blocking=False)
    x = xp.ones(2)
    for _ in range(2):
        if comm.rank == 0:
            comm.send(x, 1)
        elif comm.rank == 1:
            comm.recv(x, 0)
    comm.all_reduce(x)  # call #3 on ranks 0 and 1, #1 elsewhere: collective #1 everywhere
    np.testing.assert_array_equal(host(x), comm.size)
    comm.broadcast(x, root=comm.size - 1)
    k = warm_up_counts(comm)[1]
    try:
        if comm.rank == 0:
            with pytest.raises(col.CollectiveTimeoutError) as info:
                comm.barrier()
            message = str(info.value)
            assert f"check before barrier, collective #{k + 3}" in message  # call #5 here
            missing = ", ".join(f"rank {r} (at collective #{k + 2})" for r in range(1, comm.size))
            assert f"Ranks that have not reached collective #{k + 3}: {missing}" in message
    finally:
        MPI.COMM_WORLD.Barrier()  # the others leave once rank 0 has timed out
    comm.close()


@pytest.mark.parametrize("path", ["board", "mpi"])
def test_check_mode_passes_every_matching_verb(path, backend, xp):
    comm = with_checks_over(col.init(backend, check=True, mpi_blocking=False), path)
    size, rank = comm.size, comm.rank
    x = xp.full(3, rank, np.float64)
    assert comm.all_reduce(x.copy())[0] == sum(range(size))
    comm.reduce(x.copy(), root=size - 1)
    comm.broadcast(x.copy(), root=1)
    assert comm.all_gather(x).shape == (size, 3)
    assert comm.reduce_scatter(xp.ones((size, 2)))[0] == size
    assert comm.all_to_all(xp.ones((size, 2))).shape == (size, 2)
    comm.gather(x, root=0)
    out = comm.scatter(xp.ones((size, 2)) if rank == 0 else None, out=xp.empty(2), root=0)
    assert out.tolist() == [1.0, 1.0]
    with comm.group():
        comm.send(x, (rank + 1) % size)
        comm.recv(xp.empty(3), (rank - 1) % size)
    comm.barrier()
    # Back to back, a root may finish before the others start: it must not run past a check.
    for i in range(300):
        y = comm.broadcast(xp.full(2, i if rank == i % size else -1), root=i % size)
        assert y.tolist() == [i, i]
    comm.close()


def test_flight_record_lists_recent_calls(backend, xp):
    comm = col.init(backend, mpi_blocking=False)
    for _ in range(3):
        comm.all_reduce(xp.ones(5, np.float32))
    comm.barrier()
    record = comm.flight_record()
    assert [(c["seq"], c["call"], c["nbytes"], c["state"]) for c in record] == [
        (1, "all_reduce", 20, "completed"),
        (2, "all_reduce", 20, "completed"),
        (3, "all_reduce", 20, "completed"),
        (4, "barrier", 0, "completed"),
    ]
    assert all(c["duration_s"] >= 0 for c in record)
    comm.close()


def test_ranks_may_mix_the_forms_of_one_call(backend, xp):
    # Synchronous host calls, in place or out of place, go straight to MPI; the same call made
    # async or in a group goes the general way. Both must meet, rank by rank.
    comm = col.init(backend, mpi_blocking=False)
    rank, size = comm.rank, comm.size
    expected = np.full(4, sum(range(size)), np.float64)
    for form in range(4):
        x = xp.full(4, rank, np.float64)
        mine = (form + rank) % 4
        if mine == 0:
            comm.all_reduce(x)
        elif mine == 1:
            comm.all_reduce(x, async_op=True).wait()
        elif mine == 2:
            with comm.group():
                comm.all_reduce(x)
        else:
            wide = xp.zeros(8)
            wide[::2] = rank
            out = xp.empty(4)
            comm.all_reduce(xp.ascontiguousarray(wide[::2]), out=out)
            x = out
        np.testing.assert_array_equal(host(x), expected)
    y = xp.full(3, rank, np.int64)
    if rank % 2:
        comm.broadcast(y, root=size - 1)
    else:
        comm.broadcast(y, size - 1, async_op=True).wait()
    np.testing.assert_array_equal(host(y), size - 1)
    comm.close()


@pytest.mark.numpy_only(reason="the MPI backend's synchronous calls on NumPy arrays")
def test_a_call_holds_the_communicator_against_other_threads():
    import threading

    comm = col.init("mpi", timeout=1.5, mpi_blocking=False)
    if comm.rank == 0:
        errors: list[BaseException] = []

        def stuck() -> None:  # the other ranks never make this call
            try:
                comm.all_reduce(np.ones(2))
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                errors.append(e)

        thread = threading.Thread(target=stuck, name="stuck")
        comm.hand_over(thread)
        thread.start()
        deadline = time.monotonic() + 30
        while not comm.flight_record() and time.monotonic() < deadline:
            time.sleep(0.001)  # recorded once it holds the communicator, until it times out
        with pytest.raises(col.CommunicatorStateError, match="belongs to thread 'stuck'"):
            comm.broadcast(np.ones(2))
        thread.join(30)
        assert len(errors) == 1 and isinstance(errors[0], col.CollectiveTimeoutError), errors
        assert "all_reduce #1 (shape (2,), float64)" in str(errors[0])
        assert [c["state"] for c in comm.flight_record()] == ["timed out"]
    comm.close()


@pytest.mark.numpy_only(reason="the MPI backend's synchronous calls on NumPy arrays")
def test_a_call_that_outlasts_its_polling_is_waited_on_and_completes():
    comm = col.init("mpi", timeout=30.0, mpi_blocking=False)
    late = comm.size - 1  # the rank that arrives 0.1 s after the others
    x = np.full(3, comm.rank + 1.0)
    if comm.rank == late:
        time.sleep(0.1)  # the others poll past yield_after, then wait under the timeout
    comm.all_reduce(x)
    np.testing.assert_array_equal(x, sum(range(1, comm.size + 1)))
    y = np.full(2, float(comm.rank))
    if comm.rank == late:
        time.sleep(0.1)  # the root is late: the others cannot have its data before it sends
    comm.broadcast(y, root=late)
    np.testing.assert_array_equal(y, late)
    record = comm.flight_record()
    assert [(c["call"], c["state"]) for c in record] == [
        ("all_reduce", "completed"),
        ("broadcast", "completed"),
    ]
    # Only waits that MPI promises: everyone waits for the last contribution to a reduction,
    # and receivers for the root of a broadcast. A root may return as soon as its data is on
    # its way (Open MPI's does), so the late rank's calls have no lower bound.
    if comm.rank != late:
        assert [c["duration_s"] >= 0.09 for c in record] == [True, True], record
    comm.close()


@pytest.mark.numpy_only(reason="the MPI backend's Work, on NumPy arrays")
def test_works_that_outlast_their_polls_are_waited_on_in_any_order():
    comm = col.init("mpi", timeout=30.0, mpi_blocking=False)
    for _ in range(EVERY_CALL_UNTIL):  # past the calls whose numbers are all compared
        comm.barrier()
    late = comm.size - 1  # the rank that arrives 0.1 s after the others
    x = np.full(3, comm.rank + 1.0)
    y = np.full(2, float(comm.rank))
    if comm.rank == late:
        time.sleep(0.1)
    first = comm.all_reduce(x, async_op=True)
    second = comm.broadcast(y, root=late, async_op=True)
    # the later call first: each outlasts its poll on the others, in its own place in the
    # flight recorder
    assert second.wait() is y and first.wait() is x
    np.testing.assert_array_equal(x, sum(range(1, comm.size + 1)))
    np.testing.assert_array_equal(y, late)
    assert first.is_completed() and second.is_completed()
    # done: nothing of the library holds their arrays any more
    refs = [weakref.ref(x), weakref.ref(y)]
    del x, y, first, second
    gc.collect()
    assert [ref() for ref in refs] == [None, None]
    record = comm.flight_record()[-2:]
    assert [(c["call"], c["state"]) for c in record] == [
        ("all_reduce", "completed"),
        ("broadcast", "completed"),
    ]
    if comm.rank != late:  # each waited for the late rank
        assert [c["duration_s"] >= 0.09 for c in record] == [True, True], record
    comm.close()


@pytest.mark.numpy_only(reason="the MPI backend's Work, on NumPy arrays")
def test_a_work_times_out_naming_its_call():
    comm = init_with_short_timeout("mpi", 1.0, mpi_blocking=False)
    x = np.ones(3)
    comm.barrier()
    if comm.rank == 0:  # the others never make the call
        work = comm.all_gather(x, async_op=True)
        with pytest.raises(col.CollectiveTimeoutError, match=r"all_gather #2 \(shape \(3,\)"):
            work.wait()
        assert [c["state"] for c in comm.flight_record()] == ["completed", "timed out"]
        with pytest.raises(col.CommunicatorStateError, match="unusable after an earlier error"):
            comm.all_reduce(x)
        kept = weakref.ref(x)
        del x, work
        comm.close()  # its all_gather never ends: MPI keeps the arrays and the communicator
        gc.collect()
        assert kept() is not None and comm.mpi_comm != MPI.COMM_NULL
    else:
        comm.close()


@pytest.mark.parametrize("finish", ["wait", "synchronize"])
def test_close_with_a_call_in_flight_does_not_lose_it(backend, xp, finish):
    """Every rank made the call, so closing the communicator before waiting neither hangs nor
    loses it: the Work still finishes with the result (NCCL drains the stream before it
    destroys the communicator; MPI frees the communicator once the request has ended)."""
    comm = col.init(backend, timeout=10.0, mpi_blocking=False)
    x = xp.full(1 << 18, comm.rank + 1.0)
    work = comm.all_reduce(x, async_op=True)
    if comm.rank == comm.size - 1:
        time.sleep(0.1)  # the call is still in flight on the other ranks when they close
    start = time.monotonic()
    comm.close()
    assert time.monotonic() - start < 10.0
    assert getattr(work, finish)() is x
    np.testing.assert_array_equal(host(x[:4]), sum(range(1, comm.size + 1)))
    assert comm.closed
