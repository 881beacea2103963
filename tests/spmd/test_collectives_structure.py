"""Groups, split, DeviceMesh, several communicators, and a communicator's life cycle, on the
backend under test and its arrays (``xp``)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col

SHARED_COMM = True  # COLLECTIVES_TEST_REUSE_COMM=1 may give every test one communicator

WORLD_SIZES = (1, 2, 3, 4)
SPMD_TIMEOUT = 240


def host(a) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy array."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


def world_ranks(comm: col.Communicator, xp) -> list[int]:
    """The world rank of each member of ``comm``, in ``comm``'s rank order (via all_gather)."""
    mine = xp.array([MPI.COMM_WORLD.Get_rank()], np.int64)
    return [int(r) for r in comm.all_gather(mine)[:, 0]]


# ---------------------------------------------------------------- attributes and life cycle


def test_attributes(comm, backend):
    world = MPI.COMM_WORLD
    assert comm.rank == world.Get_rank() and comm.size == world.Get_size()
    # Every rank of these jobs runs on this one machine.
    assert (comm.local_rank, comm.local_size) == (comm.rank, comm.size)
    assert comm.backend == backend
    if backend == "mpi":
        assert comm.device is None and comm.stream is None
    assert isinstance(comm.mpi_comm, MPI.Comm)
    assert comm.mpi_comm.Get_size() == comm.size and comm.mpi_comm.Get_rank() == comm.rank
    # A duplicate of the world, not the world itself: its traffic cannot mix with others'.
    assert MPI.Comm.Compare(comm.mpi_comm, world) == MPI.CONGRUENT
    assert not comm.closed
    assert f"rank={comm.rank}" in repr(comm) and f"size={comm.size}" in repr(comm)


def test_init_twice_gives_independent_communicators(comm, backend, xp):
    other = col.init(backend=backend, timeout=30)
    try:
        assert other is not comm and other.mpi_comm != comm.mpi_comm
        assert MPI.Comm.Compare(other.mpi_comm, comm.mpi_comm) == MPI.CONGRUENT
        size, rank = comm.size, comm.rank
        # Interleaved async calls, completed in the opposite order to their start.
        a = xp.full(3, rank + 1, np.int64)
        b = xp.full(3, 10 * (rank + 1), np.int64)
        wa = comm.all_reduce(a, async_op=True)
        wb = other.all_reduce(b, op="max", async_op=True)
        assert wb.wait() is b and wa.wait() is a
        np.testing.assert_array_equal(host(a), size * (size + 1) // 2)
        np.testing.assert_array_equal(host(b), 10 * size)
        # Messages on one communicator never match receives on the other, whatever the order.
        if size >= 2 and rank < 2:
            peer = 1 - rank
            if rank == 0:
                comm.send(xp.array([1.0]), peer)
                other.send(xp.array([2.0]), peer)
            else:
                got_other, got_comm = xp.zeros(1), xp.zeros(1)
                w = comm.recv(got_comm, peer, async_op=True)
                other.recv(got_other, peer)
                w.wait()
                assert (got_comm[0], got_other[0]) == (1.0, 2.0)
        other.barrier()
    finally:
        other.close()
    # Closing one leaves the other working.
    np.testing.assert_array_equal(host(comm.all_gather(xp.array([rank]))), np.arange(size)[:, None])


def test_context_manager_closes(backend, xp):
    with col.init(backend=backend, timeout=30) as c:
        assert not c.closed
        x = xp.ones(2, np.float32)
        c.all_reduce(x)
        np.testing.assert_array_equal(host(x), c.size)
    assert c.closed
    with pytest.raises(col.CommunicatorStateError, match="^all_reduce: communicator is closed"):
        c.all_reduce(x)


def test_close_is_idempotent_and_use_after_close_is_clear(backend, xp):
    c = col.init(backend=backend, timeout=30)
    c.close()
    c.close()
    assert c.closed
    x = xp.zeros(2, np.float32)
    calls = {
        "all_reduce": lambda: c.all_reduce(x),
        "reduce": lambda: c.reduce(x),
        "broadcast": lambda: c.broadcast(x),
        "all_gather": lambda: c.all_gather(x),
        "recv": lambda: c.recv(x, (c.rank + 1) % c.size),
        "barrier": lambda: c.barrier(),
        "split": lambda: c.split(0),
        "group": lambda: c.group().__enter__(),
    }
    if c.size == 1:
        del calls["recv"]  # a recv from itself outside a group is refused first
    for call, make in calls.items():
        with pytest.raises(col.CommunicatorStateError) as info:
            make()
        assert str(info.value).startswith(f"{call}: communicator is closed"), str(info.value)
        # a state error, not a bad argument
        assert isinstance(info.value, RuntimeError) and not isinstance(info.value, ValueError)
    with pytest.raises(col.CommunicatorStateError):
        c.barrier(async_op=True)


def test_abort_then_use_is_clear(backend, xp):
    c = col.init(backend=backend, timeout=30)
    c.barrier()
    c.abort()
    c.abort()  # idempotent too
    c.close()  # and close after abort is harmless
    with pytest.raises(col.CommunicatorStateError) as info:
        c.all_gather(xp.zeros(1))
    assert str(info.value).startswith("all_gather: communicator was aborted")


# ---------------------------------------------------------------- group


def test_group_ring_both_directions_several_arrays(comm, xp):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    sends = [xp.full(k + 1, 100 * rank + k, np.int32) for k in range(3)]
    from_left = [xp.zeros(k + 1, np.int32) for k in range(3)]
    from_right = [xp.zeros(k + 1, np.int32) for k in range(3)]
    with comm.group() as g:
        assert g is comm
        # Receives posted before the sends: only a batched launch makes this order safe.
        for k in range(3):
            comm.recv(from_left[k], left)
            comm.recv(from_right[k], right)
        for k in range(3):
            comm.send(sends[k], right)
            comm.send(sends[k], left)
    for k in range(3):
        np.testing.assert_array_equal(host(from_left[k]), 100 * left + k)
        np.testing.assert_array_equal(host(from_right[k]), 100 * right + k)


def test_group_with_async_works_and_a_collective(comm, xp):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    got = xp.zeros(4, np.float64)
    total = xp.full(2, rank, np.int64)
    with comm.group():
        w_send = comm.send(xp.arange(4.0) + rank, right, async_op=True)
        w_recv = comm.recv(got, left, async_op=True)
        w_sum = comm.all_reduce(total, async_op=True)
        assert all(isinstance(w, col.Work) for w in (w_send, w_recv, w_sum))
    # The block's end completed them (on NCCL: queued them on the device, behind which
    # synchronize() waits); waiting again is harmless and returns the results.
    if comm.backend == "nccl":
        for w in (w_send, w_recv, w_sum):
            w.synchronize()
    assert w_recv.is_completed() and w_send.is_completed() and w_sum.is_completed()
    assert w_recv.wait() is got and w_sum.wait() is total and w_send.wait() is None
    np.testing.assert_array_equal(host(got), np.arange(4.0) + left)
    np.testing.assert_array_equal(host(total), size * (size - 1) // 2)


def test_nested_group_joins_the_outer_one(comm, xp):
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    a, b = xp.zeros(2, np.int64), xp.zeros(2, np.int64)
    with comm.group():
        comm.recv(a, left)
        with comm.group() as inner:
            assert inner is comm
            comm.recv(b, right)
            comm.send(xp.full(2, rank), right)
        # Still inside the outer group: the inner block's end must not have waited alone.
        comm.send(xp.full(2, rank + 10), left)
    np.testing.assert_array_equal(host(a), left)
    np.testing.assert_array_equal(host(b), right + 10)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux's CPU affinity")
def test_ranks_pinned_to_cpus_of_their_own_poll_and_ranks_sharing_one_yield(comm, backend):
    """Each local rank pinned to one CPU, round robin over those the node's ranks may use:
    a rank waits busy (10 ms before yielding) only where no other rank has its CPU."""
    before = os.sched_getaffinity(0)
    cpus = sorted(frozenset().union(*comm.mpi_comm.allgather(before)))
    os.sched_setaffinity(0, {cpus[comm.local_rank % len(cpus)]})
    try:
        with col.init(backend, timeout=30) as pinned:
            assert pinned.yield_after == (0.0 if comm.local_size > len(cpus) else 1e-2)
    finally:
        os.sched_setaffinity(0, before)


def test_send_recv_to_self_inside_group(comm, xp):
    x = xp.arange(5, dtype=np.float32) + comm.rank
    y = xp.zeros_like(x)
    with comm.group():
        comm.send(x, comm.rank)
        comm.recv(y, comm.rank)
    np.testing.assert_array_equal(host(y), host(x))


def test_sendrecv_inside_group_with_sends_and_recvs(comm, xp):
    """Inside a group a sendrecv may send to this rank while a recv of the group receives it
    (and the reverse); it completes with the group."""
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    x = xp.arange(3, dtype=np.float64) + rank
    to_self, from_left = xp.zeros_like(x), xp.zeros_like(x)
    with comm.group():
        got = comm.sendrecv(x, rank, source=left)  # x to itself
        comm.send(x, right)  # received by the right's sendrecv
        comm.recv(to_self, rank)
        work = comm.sendrecv(x + 100, right, source=rank, async_op=True)
        comm.send(x + 200, rank)
        comm.recv(from_left, left)
    mine, lefts = host(x), host(x) - rank + left
    np.testing.assert_array_equal(host(got), lefts)
    np.testing.assert_array_equal(host(to_self), mine)
    # one rank: every message is to itself, received in the order sent
    expected = (mine + 100, mine + 200) if size == 1 else (mine + 200, lefts + 100)
    np.testing.assert_array_equal(host(work.wait()), expected[0])
    np.testing.assert_array_equal(host(from_left), expected[1])


def test_group_error_inside_block_propagates(comm, xp):
    """An exception raised inside the block propagates unchanged; the queued calls still run."""
    size, rank = comm.size, comm.rank
    got = xp.zeros(1, np.int64)
    with pytest.raises(KeyError):
        with comm.group():
            comm.send(xp.array([rank]), (rank + 1) % size)
            comm.recv(got, (rank - 1) % size)
            raise KeyError("user error")
    # The communicator stays usable and in step on every rank.
    x = xp.array([1], np.int64)
    comm.all_reduce(x)
    assert x[0] == size


# ---------------------------------------------------------------- split


def test_split_even_odd(comm, xp):
    size, rank = comm.size, comm.rank
    child = comm.split(rank % 2)
    try:
        members = [r for r in range(size) if r % 2 == rank % 2]
        assert child.size == len(members) and child.rank == members.index(rank)
        assert child.backend == comm.backend
        assert world_ranks(child, xp) == members
        x = xp.array([rank], np.int64)
        child.all_reduce(x)
        assert x[0] == sum(members)
        # Collectives on the child and the parent interleave freely.
        y = xp.array([1.0])
        w = comm.all_reduce(y, async_op=True)
        child.broadcast(x, root=child.size - 1)
        w.wait()
        assert y[0] == size
    finally:
        child.close()
    # The parent stays usable after the child is closed.
    assert comm.all_gather(xp.array([rank]))[:, 0].tolist() == list(range(size))


def test_split_color_none_returns_none(comm, xp):
    size, rank = comm.size, comm.rank
    child = comm.split(None if rank == 0 else 3)
    if rank == 0:
        assert child is None
    else:
        try:
            assert child.size == size - 1 and child.rank == rank - 1
            assert world_ranks(child, xp) == list(range(1, size))
        finally:
            child.close()
    comm.barrier()


def test_split_key_orders_ranks(comm, xp):
    size, rank = comm.size, comm.rank
    child = comm.split(0, key=size - rank)
    try:
        assert child.size == size and child.rank == size - 1 - rank
        assert world_ranks(child, xp) == list(reversed(range(size)))
        # Root 0 of the child is the parent's last rank.
        x = xp.array([rank], np.int64)
        child.broadcast(x, root=0)
        assert x[0] == size - 1
    finally:
        child.close()
    # Computed at creation (a watchdog thread reads them without calling MPI): still
    # there once the child's MPI communicator is freed.
    assert child.mpi_comm_world_ranks() == list(reversed(range(size)))


def test_split_of_split_and_close_order(comm, xp):
    size, rank = comm.size, comm.rank
    child = comm.split(0)
    grandchild = child.split(child.rank // 2)
    try:
        expected = [r for r in range(size) if r // 2 == rank // 2]
        assert world_ranks(grandchild, xp) == expected
    finally:
        child.close()  # closing the middle one first leaves the grandchild working
        x = xp.array([1])
        grandchild.all_reduce(x)
        assert x[0] == len(expected)
        grandchild.close()


def test_split_bad_color_is_local_error(comm):
    for color in (-1, 1.5, "a"):
        with pytest.raises(col.InvalidArgumentError) as info:
            comm.split(color)
        message = str(info.value)
        assert message.startswith("split: color must be a non-negative int or None")
        assert repr(color) in message


# ---------------------------------------------------------------- DeviceMesh


def test_mesh_one_dimension_as_a_context_manager(comm, xp):
    with col.DeviceMesh(comm, {"dp": comm.size}) as mesh:
        assert mesh.coord == {"dp": comm.rank}
        assert world_ranks(mesh["dp"], xp) == list(range(comm.size))
        dp = mesh["dp"]
        assert dp is mesh.group("dp")
    assert mesh.closed and dp.closed  # what the mesh made is closed with it
    mesh.close()  # again: nothing to do
    with pytest.raises(col.CommunicatorStateError, match="^DeviceMesh.group: the mesh is closed"):
        mesh["dp"]
    comm.barrier()  # closing the mesh leaves its parent alone


def test_mesh_with_unit_dimension(comm, xp):
    mesh = col.DeviceMesh(comm, {"pp": 1, "tp": comm.size})
    try:
        assert mesh.coord == {"pp": 0, "tp": comm.rank}
        assert mesh["pp"].size == 1 and mesh["pp"].rank == 0
        assert world_ranks(mesh["tp"], xp) == list(range(comm.size))
    finally:
        mesh.close()


def test_mesh_two_by_two(comm, xp):
    if comm.size != 4:
        pytest.skip("a 2 x 2 mesh needs 4 ranks")
    rank = comm.rank
    mesh = col.DeviceMesh(comm, {"a": 2, "b": 2})
    try:
        assert mesh.coord == {"a": rank // 2, "b": rank % 2}
        assert world_ranks(mesh["a"], xp) == [rank % 2, rank % 2 + 2]
        assert world_ranks(mesh["b"], xp) == [rank // 2 * 2, rank // 2 * 2 + 1]
        assert mesh["a"].rank == rank // 2 and mesh["b"].rank == rank % 2
        whole = mesh.group("a", "b")
        assert whole is mesh.group("b", "a")
        assert (whole.size, whole.rank) == (4, rank)
        assert world_ranks(whole, xp) == [0, 1, 2, 3]
        x = xp.array([rank], np.int64)
        mesh["a"].all_reduce(x)
        assert x[0] == (rank % 2) + (rank % 2 + 2)
    finally:
        mesh.close()


def test_mesh_errors(comm):
    size = comm.size
    with pytest.raises(col.InvalidArgumentError) as info:
        col.DeviceMesh(comm, {"a": size + 1, "b": 2})
    message = str(info.value)
    assert message.startswith("DeviceMesh: ") and f"{2 * (size + 1)}" in message
    assert f"comm.size = {size}" in message
    for bad in ({}, {"a": 0}, {"a": -size}, {"a": float(size)}, {1: size}):
        with pytest.raises(col.InvalidArgumentError, match="^DeviceMesh: "):
            col.DeviceMesh(comm, bad)
    mesh = col.DeviceMesh(comm, {"x": size})
    try:
        with pytest.raises(col.InvalidArgumentError) as info:
            mesh.group("y")
        assert str(info.value).startswith("DeviceMesh.group: names must be among ('x',)")
        assert "'y'" in str(info.value)
        with pytest.raises(col.InvalidArgumentError):
            mesh["tp"]
        with pytest.raises(col.InvalidArgumentError):
            mesh.group()
    finally:
        mesh.close()
