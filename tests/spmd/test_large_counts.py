"""Counts above what one MPI call takes (2**31 - 1 elements where counts are C ints, as on
Open MPI 5) are made in parts: here at a limit lowered to 5 elements, every verb's result is
checked element by element against one computed with NumPy.

White-box on purpose (one of the few test modules that reach a private name): the limit is
the MPI backend's ``MAX_COUNT``, lowered for the test, since calls of 2**31 elements are
more than a test machine holds; nothing public sets it.
"""

from __future__ import annotations

import numpy as np
import pytest

import collectives as col

SHARED_COMM = True  # COLLECTIVES_TEST_REUSE_COMM=1 may give every test one communicator

WORLD_SIZES = (2, 3)
SPMD_TIMEOUT = 120

N = 13  # elements per rank: runs of 5, 5 and 3 at the lowered limit


def mine(rank: int, shape: tuple = (N,)) -> np.ndarray:
    """Rank ``rank``'s distinct values (exact in float64)."""
    return np.arange(np.prod(shape), dtype=np.float64).reshape(shape) + 1000.0 * (rank + 1)


def host(a):
    return a.get() if hasattr(a, "get") else a


@pytest.fixture
def parts_comm(monkeypatch, backend):
    from collectives._mpi import backend as _mpi

    monkeypatch.setattr(_mpi, "MAX_COUNT", 5)
    comm = col.init(backend, timeout=20.0)
    if comm.backend != "mpi":
        comm.close()
        pytest.skip("the parts are the MPI backend's")
    yield comm
    comm.close()


def run(comm, call, async_op):
    return call.wait() if async_op else call


@pytest.mark.parametrize(
    "call", ["all_reduce", "all_reduce_avg", "all_reduce_out", "reduce", "broadcast"]
)
def test_element_wise_verbs(parts_comm, xp, call):
    comm = parts_comm
    size, rank = comm.size, comm.rank
    values = np.arange(23.0).reshape(23, 1)  # runs of 5, ..., 5 and 3
    given = values * (rank + 1)
    x = xp.asarray(given)
    total = values * size * (size + 1) / 2
    if call == "all_reduce":
        got, want = comm.all_reduce(x, async_op=True).wait(), total
    elif call == "all_reduce_avg":
        got, want = comm.all_reduce(x, op="avg", async_op=True).wait(), total / size
    elif call == "all_reduce_out":
        got = comm.all_reduce(x, out=xp.empty_like(x), async_op=True).wait()
        want = total
        np.testing.assert_array_equal(host(x), given)  # x unchanged
    elif call == "reduce":
        got, want = comm.reduce(x, root=size - 1, async_op=True).wait(), total
        if rank != size - 1:
            want = given
    else:
        got, want = comm.broadcast(x, root=0, async_op=True).wait(), values
    np.testing.assert_array_equal(host(got), want)
    assert [c["state"] for c in comm.flight_record()] == ["completed"]


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("in_place", [False, True], ids=["apart", "in_place"])
def test_all_gather(parts_comm, xp, async_op, in_place):
    comm = parts_comm
    size, rank = comm.size, comm.rank
    want = np.stack([mine(r) for r in range(size)])
    if in_place:
        out = xp.zeros((size, N))
        out[rank] = xp.asarray(mine(rank))
        got = run(comm, comm.all_gather(out[rank], out=out, async_op=async_op), async_op)
    else:
        got = run(comm, comm.all_gather(xp.asarray(mine(rank)), async_op=async_op), async_op)
    np.testing.assert_array_equal(host(got), want)
    assert [c["state"] for c in comm.flight_record()] == ["completed"]


@pytest.mark.parametrize("op", ["sum", "avg", "max"])
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_reduce_scatter(parts_comm, xp, op, async_op):
    comm = parts_comm
    size, rank = comm.size, comm.rank
    every = np.stack([mine(r, (size, N)) for r in range(size)])
    want = {"sum": every.sum(0), "avg": every.sum(0) / size, "max": every.max(0)}[op][rank]
    x = xp.asarray(mine(rank, (size, N)))
    got = run(comm, comm.reduce_scatter(x, op, async_op=async_op), async_op)
    np.testing.assert_array_equal(host(got), want)
    np.testing.assert_array_equal(host(x), mine(rank, (size, N)))  # x unchanged


def test_reduce_scatter_in_place(parts_comm, xp):
    comm = parts_comm
    size, rank = comm.size, comm.rank
    x = xp.asarray(mine(rank, (size, N)))
    got = comm.reduce_scatter(x, out=x[rank])
    want = sum(mine(r, (size, N)) for r in range(size))[rank]
    np.testing.assert_array_equal(host(got), want)
    np.testing.assert_array_equal(host(x[rank]), want)


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("in_place", [False, True], ids=["apart", "in_place"])
def test_all_to_all(parts_comm, xp, async_op, in_place):
    comm = parts_comm
    size, rank = comm.size, comm.rank
    x = xp.asarray(mine(rank, (size, N)))
    out = x if in_place else None
    got = run(comm, comm.all_to_all(x, out=out, async_op=async_op), async_op)
    want = np.stack([mine(r, (size, N))[rank] for r in range(size)])
    np.testing.assert_array_equal(host(got), want)


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("in_place", [False, True], ids=["apart", "in_place"])
def test_gather(parts_comm, xp, async_op, in_place):
    comm = parts_comm
    size, rank = comm.size, comm.rank
    root = size - 1
    if rank == root and in_place:
        out = xp.zeros((size, N))
        out[root] = xp.asarray(mine(root))
        got = run(comm, comm.gather(out[root], root, out=out, async_op=async_op), async_op)
    else:
        got = run(comm, comm.gather(xp.asarray(mine(rank)), root, async_op=async_op), async_op)
    if rank == root:
        np.testing.assert_array_equal(host(got), np.stack([mine(r) for r in range(size)]))
    else:
        assert got is None


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("in_place", [False, True], ids=["apart", "in_place"])
def test_scatter(parts_comm, xp, async_op, in_place):
    comm = parts_comm
    size, rank = comm.size, comm.rank
    root = size - 1
    whole = np.stack([mine(r) for r in range(size)])
    if rank == root:
        x = xp.asarray(whole)
        out = x[root] if in_place else None
        got = run(comm, comm.scatter(x, root, out=out, async_op=async_op), async_op)
    else:
        got = run(comm, comm.scatter(None, root, out=xp.zeros(N), async_op=async_op), async_op)
    np.testing.assert_array_equal(host(got), whole[rank])


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_sendrecv(parts_comm, xp, async_op):
    # in parts, a recv and a send; twice in a row: their parts must not mix
    comm = parts_comm
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    got = [
        comm.sendrecv(xp.asarray(mine(rank) * k), right, source=left, async_op=async_op)
        for k in (1, 2)
    ]
    if async_op:
        got = [work.wait() for work in got]
    np.testing.assert_array_equal(host(got[0]), mine(left))
    np.testing.assert_array_equal(host(got[1]), mine(left) * 2)


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_send_recv(parts_comm, xp, async_op):
    # Two messages each way in a row: their parts must not mix.
    comm = parts_comm
    rank = comm.rank
    if rank > 1:
        return
    peer = 1 - rank
    works = [comm.send(xp.asarray(mine(rank) * k), peer, async_op=True) for k in (1, 2)]
    got = [xp.zeros(N), xp.zeros(N)]
    for buf in got:
        done = comm.recv(buf, peer, async_op=async_op)
        if async_op:
            done.wait()
    for work in works:
        work.wait()
    np.testing.assert_array_equal(host(got[0]), mine(peer))
    np.testing.assert_array_equal(host(got[1]), mine(peer) * 2)
