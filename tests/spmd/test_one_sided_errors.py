"""An argument error that depends on a rank's role (root or not) fails the communicator on
every rank: the erring rank raises ``InvalidArgumentError``, every other rank the same class
(one class per event) naming it at its current wait or next call, never a wrong result.
On a communicator whose collectives are blocking MPI calls, the other ranks are inside a
call that nothing can interrupt: the job ends after the timeout, as for any stuck blocking
call; these tests use non-blocking calls."""

from __future__ import annotations

import numpy as np
import pytest

import collectives as col
from tests.short_timeout import init_with_short_timeout

WORLD_SIZES = (2, 3)
SPMD_TIMEOUT = 120


def one_sided(backend, call, erring, wrong, right):
    """``wrong(comm)`` on rank ``erring``, ``right(comm)`` elsewhere, then an all_reduce."""
    comm = init_with_short_timeout(backend, 5.0, mpi_blocking=False)
    try:
        if comm.rank == erring:
            with pytest.raises(col.InvalidArgumentError, match=f"^{call}: "):
                wrong(comm)
            with pytest.raises(col.CommunicatorStateError):
                comm.all_reduce(comm.xp.ones(2, np.float32))
        else:
            with pytest.raises(col.InvalidArgumentError) as info:
                right(comm)
                x = comm.xp.ones(2, np.float32)
                comm.all_reduce(x)
                raise AssertionError(f"all_reduce completed: {x}")
            message = str(info.value)
            assert f"rank {erring} " in message and f"{call}: " in message, message
            assert "declared it failed" in message, message
    finally:
        comm.close()
    fresh = col.init(backend)
    fresh.barrier()
    fresh.close()


def test_gather_wrong_out_on_root(backend):
    def wrong(comm):
        comm.gather(comm.xp.ones(3, np.float32), 0, out=comm.xp.zeros((comm.size, 4), np.float32))

    def right(comm):
        comm.gather(comm.xp.ones(3, np.float32), 0)

    one_sided(backend, "gather", 0, wrong, right)


@pytest.mark.numpy_only(reason="CuPy arrays have no read-only flag")
def test_broadcast_read_only_off_root(backend):
    def x(comm, writeable=True):
        a = np.full(3, comm.rank, np.int64)
        a.flags.writeable = writeable
        return a

    one_sided(
        backend,
        "broadcast",
        1,
        lambda comm: comm.broadcast(x(comm, False), 0),
        lambda comm: comm.broadcast(x(comm), 0),
    )


def test_reduce_wrong_out_on_root(backend):
    def wrong(comm):
        comm.reduce(comm.xp.ones(3, np.float32), 0, out=comm.xp.zeros(4, np.float32))

    def right(comm):
        comm.reduce(comm.xp.ones(3, np.float32), 0)

    one_sided(backend, "reduce", 0, wrong, right)


def test_scatter_wrong_x_on_root(backend):
    def wrong(comm):
        comm.scatter(comm.xp.ones((comm.size + 1, 2), np.float32), 0)

    def right(comm):
        comm.scatter(None, 0, out=comm.xp.zeros(2, np.float32))

    one_sided(backend, "scatter", 0, wrong, right)
