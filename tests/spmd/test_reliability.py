"""Timeouts, check mode and the flight recorder, across real ranks."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

import collectives as col

WORLD_SIZES = (2, 3)


def test_stuck_collective_times_out_naming_call_and_missing_ranks(tmp_path, monkeypatch):
    monkeypatch.setenv("COLLECTIVES_FLIGHT_RECORDER", str(tmp_path))
    comm = col.init(timeout=1.0)
    x = np.ones(3)
    comm.all_reduce(x)
    if comm.rank == 0:
        start = time.monotonic()
        with pytest.raises(col.CollectiveTimeoutError) as info:
            comm.all_reduce(x)
        waited = time.monotonic() - start
        assert 1.0 <= waited < 3.0  # within timeout + 2 s
        message = str(info.value)
        assert "all_reduce #2" in message and "shape (3,)" in message
        missing = ", ".join(f"rank {r} (at collective #1)" for r in range(1, comm.size))
        assert f"Ranks that have not reached collective #2: {missing}" in message
        with pytest.raises(col.CollectivesError, match="unusable after an earlier error"):
            comm.broadcast(x)
        assert [c["state"] for c in comm.flight_record()] == ["completed", "timed out"]
        dumped = json.loads((tmp_path / "flight-recorder.rank0.json").read_text())
        assert [(c["seq"], c["call"], c["state"]) for c in dumped["calls"]] == [
            (1, "all_reduce", "completed"),
            (2, "all_reduce", "timed out"),
        ]
    comm.close()


def test_timeout_on_point_to_point_names_recv():
    comm = col.init(timeout=0.5)
    if comm.rank == 1:
        with pytest.raises(col.CollectiveTimeoutError, match=r"recv #1 \(shape \(2,\), int32\)"):
            comm.recv(np.empty(2, np.int32), 0)
    comm.close()


MISMATCHES = {
    "op": (lambda c, x: c.all_reduce(x, op="max" if c.rank else "sum"), "op differs"),
    "shape": (lambda c, x: c.all_reduce(np.ones(3 + c.rank)), "shape differs"),
    "dtype": (lambda c, x: c.all_reduce(x.astype(np.float32) if c.rank else x), "dtype differs"),
    "root": (lambda c, x: c.broadcast(x, root=min(c.rank, 1)), "root differs"),
    "call": (lambda c, x: c.all_reduce(x) if c.rank else c.broadcast(x), "call differs"),
    "skipped": (None, None),
}


def with_checks_over(comm, path: str):
    """Check over the node's shared memory (the default on one node), or over MPI (as when
    ranks span nodes)."""
    from collectives._check import Checker

    if path == "mpi":
        comm._checker.close()
        comm._checker = Checker(comm, shared_memory=False)
        assert comm._checker._board is None
    else:
        assert comm._checker._board is not None
    return comm


@pytest.mark.parametrize("path", ["board", "mpi"])
@pytest.mark.parametrize("kind", sorted(MISMATCHES))
def test_check_mode_catches_mismatch_on_every_rank(kind, path):
    call, expected = MISMATCHES[kind]
    comm = with_checks_over(col.init(check=True, timeout=5.0), path)
    x = np.arange(4.0)
    comm.all_reduce(x)  # a matching call passes
    np.testing.assert_array_equal(x, np.arange(4.0) * comm.size)
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


def test_check_mode_and_progress_board_number_collectives_apart_from_point_to_point():
    """Ranks 0 and 1 exchange messages the others do not make: their next collectives still
    match in check mode, and a stuck one reports by collective, not by call."""
    comm = col.init(check=True, timeout=1.5)
    x = np.ones(2)
    for _ in range(2):
        if comm.rank == 0:
            comm.send(x, 1)
        elif comm.rank == 1:
            comm.recv(x, 0)
    comm.all_reduce(x)  # call #3 on ranks 0 and 1, #1 elsewhere: collective #1 everywhere
    np.testing.assert_array_equal(x, comm.size)
    comm.broadcast(x, root=comm.size - 1)
    if comm.rank == 0:
        with pytest.raises(col.CollectiveTimeoutError) as info:
            comm.barrier()
        message = str(info.value)
        assert "check before barrier, collective #3" in message  # call #5 here
        missing = ", ".join(f"rank {r} (at collective #2)" for r in range(1, comm.size))
        assert f"Ranks that have not reached collective #3: {missing}" in message
    else:
        time.sleep(2.0)  # let rank 0 time out, then leave together
    comm.close()


@pytest.mark.parametrize("path", ["board", "mpi"])
def test_check_mode_passes_every_matching_verb(path):
    comm = with_checks_over(col.init(check=True), path)
    size, rank = comm.size, comm.rank
    x = np.full(3, rank, np.float64)
    assert comm.all_reduce(x.copy())[0] == sum(range(size))
    comm.reduce(x.copy(), root=size - 1)
    comm.broadcast(x.copy(), root=1)
    assert comm.all_gather(x).shape == (size, 3)
    assert comm.reduce_scatter(np.ones((size, 2)))[0] == size
    assert comm.all_to_all(np.ones((size, 2))).shape == (size, 2)
    comm.gather(x, root=0)
    out = comm.scatter(np.ones((size, 2)) if rank == 0 else None, out=np.empty(2), root=0)
    assert out.tolist() == [1.0, 1.0]
    with comm.group():
        comm.send(x, (rank + 1) % size)
        comm.recv(np.empty(3), (rank - 1) % size)
    comm.barrier()
    # Back to back, a root may finish before the others start: it must not run past a check.
    for i in range(300):
        y = comm.broadcast(np.full(2, i if rank == i % size else -1), root=i % size)
        assert y.tolist() == [i, i]
    comm.close()


def test_flight_record_lists_recent_calls():
    comm = col.init()
    for _ in range(3):
        comm.all_reduce(np.ones(5, np.float32))
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


def test_ranks_may_mix_the_forms_of_one_call():
    # Synchronous host calls, in place or out of place, go straight to MPI; the same call made
    # async or in a group goes the general way. Both must meet, rank by rank.
    comm = col.init()
    rank, size = comm.rank, comm.size
    expected = np.full(4, sum(range(size)), np.float64)
    for form in range(4):
        x = np.full(4, rank, np.float64)
        mine = (form + rank) % 4
        if mine == 0:
            comm.all_reduce(x)
        elif mine == 1:
            comm.all_reduce(x, async_op=True).wait()
        elif mine == 2:
            with comm.group():
                comm.all_reduce(x)
        else:
            wide = np.zeros(8)
            wide[::2] = rank
            out = np.empty(4)
            comm.all_reduce(np.ascontiguousarray(wide[::2]), out=out)
            x = out
        np.testing.assert_array_equal(x, expected)
    y = np.full(3, rank, np.int64)
    if rank % 2:
        comm.broadcast(y, root=size - 1)
    else:
        comm.broadcast(y, size - 1, async_op=True).wait()
    np.testing.assert_array_equal(y, size - 1)
    comm.close()


def test_a_direct_call_holds_the_communicator_against_other_threads():
    import threading

    comm = col.init(timeout=1.5)
    if comm.rank == 0:
        errors: list[BaseException] = []

        def stuck() -> None:  # the other ranks never make this call
            try:
                comm.all_reduce(np.ones(2))
            except BaseException as e:  # noqa: BLE001 - handed to the main thread
                errors.append(e)

        thread = threading.Thread(target=stuck)
        thread.start()
        deadline = time.monotonic() + 10
        while comm._seq < 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(0.05)
        with pytest.raises(col.InvalidArgumentError, match="in use by another thread"):
            comm.broadcast(np.ones(2))
        thread.join(30)
        assert len(errors) == 1 and isinstance(errors[0], col.CollectiveTimeoutError), errors
        assert "all_reduce #1 (shape (2,), float64)" in str(errors[0])
        assert [c["state"] for c in comm.flight_record()] == ["timed out"]
    comm.close()


def test_a_direct_call_that_outlasts_its_polling_is_waited_on_and_completes():
    comm = col.init(timeout=30.0)
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
