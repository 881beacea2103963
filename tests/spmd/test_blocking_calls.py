"""Collectives as blocking MPI calls (``init(mpi_blocking=True)``, the default with Open MPI
and Intel MPI), against NumPy references; each form either way."""

from __future__ import annotations

import numpy as np
import pytest

import collectives as col

pytestmark = pytest.mark.numpy_only("the MPI backend's own setting")
WORLD_SIZES = (1, 2, 3)


@pytest.fixture(params=[True, False], ids=["blocking", "non-blocking"])
def comm(request):
    c = col.init(backend="mpi", timeout=30, mpi_blocking=request.param)
    yield c
    c.close()


def test_the_communicator_says_which_calls_it_makes(comm):
    blocking = "blocking MPI collectives" in comm.call_path
    assert blocking != ("non-blocking MPI calls" in comm.call_path)
    # an async call of a blocking communicator has completed when it returns
    work = comm.all_reduce(np.ones(2), async_op=True)
    assert work.is_completed() or not blocking
    work.wait()


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "uint8"])
@pytest.mark.parametrize("op", ["sum", "max", "min"])
def test_all_reduce_in_and_out_of_place(comm, dtype, op):
    size, rank = comm.size, comm.rank
    mine = (np.arange(12) % 5 + rank).astype(dtype).reshape(3, 4)
    every = [(np.arange(12) % 5 + r).astype(dtype).reshape(3, 4) for r in range(size)]
    reduce = {"sum": np.sum, "max": np.max, "min": np.min}[op]
    expected = reduce(np.stack(every), axis=0).astype(dtype)
    out = np.zeros_like(mine)
    assert comm.all_reduce(mine, op, out=out) is out
    np.testing.assert_array_equal(out, expected)
    assert comm.all_reduce(mine, op) is mine
    np.testing.assert_array_equal(mine, expected)


@pytest.mark.parametrize("root_from_end", [0, 1])
def test_broadcast(comm, root_from_end):
    root = max(comm.size - 1 - root_from_end, 0)
    x = np.full(1000, float(comm.rank))
    assert comm.broadcast(x, root) is x
    np.testing.assert_array_equal(x, float(root))


def test_many_calls_in_a_row_keep_step(comm):
    x = np.zeros(1)
    for i in range(200):
        x[0] = i + comm.rank
        comm.all_reduce(x)
        assert x[0] == comm.size * i + sum(range(comm.size))
    assert [c["state"] for c in comm.flight_record()] == ["completed"] * 64


def test_every_other_collective(comm):
    size, rank = comm.size, comm.rank
    root = size - 1
    mine = np.arange(6.0).reshape(2, 3) + rank
    every = np.stack([np.arange(6.0).reshape(2, 3) + r for r in range(size)])
    x = mine.copy()
    assert comm.reduce(x, root, "max") is x
    np.testing.assert_array_equal(x, every.max(axis=0) if rank == root else mine)
    np.testing.assert_array_equal(comm.all_gather(mine), every)
    parts = np.stack([mine + r for r in range(size)])  # part r for rank r
    out = np.empty_like(mine)
    assert comm.reduce_scatter(parts, out=out) is out
    np.testing.assert_array_equal(out, every.sum(axis=0) + size * rank)
    np.testing.assert_array_equal(comm.all_to_all(parts), np.stack([e + rank for e in every]))
    gathered = comm.gather(mine, root)
    if rank == root:
        np.testing.assert_array_equal(gathered, every)
    got = comm.scatter(every if rank == root else None, root, out=np.empty_like(mine))
    np.testing.assert_array_equal(got, every[rank])
    comm.barrier()
    assert [c["state"] for c in comm.flight_record()][-7:] == ["completed"] * 7


def test_sendrecv_matches_sends_and_recvs_either_way(comm):
    """A blocking sendrecv pairs with the peer's non-blocking send and recv, and its own."""
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    mine = np.arange(4.0) + rank
    out = np.empty_like(mine)
    assert comm.sendrecv(mine, right, out=out, source=left) is out
    np.testing.assert_array_equal(out, np.arange(4.0) + left)
    peer = rank ^ 1
    if peer < size:
        if rank % 2:
            got = comm.sendrecv(mine, peer)
        else:
            got = np.empty_like(mine)
            comm.recv(got, peer)
            comm.send(mine, peer)
        np.testing.assert_array_equal(got, np.arange(4.0) + peer)
    assert [c["state"] for c in comm.flight_record()] == ["completed"] * len(comm.flight_record())
