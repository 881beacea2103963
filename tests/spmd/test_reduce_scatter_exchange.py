"""Two ranks' reduce_scatter as one exchange (the MPI backend's, where MPI has
``MPI_Isendrecv``): each rank sends the part the other keeps and reduces what it gets into
its own. The exchange is point-to-point under a tag of its own, so it must never meet a
user's message, and every rank must make it whatever kind of array it passes, so that ranks
meet.
"""

from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col

WORLD_SIZES = (2,)
SPMD_TIMEOUT = 120


class Tagged(np.ndarray):
    """A NumPy array of another type (a subclass), on one rank only."""


@pytest.fixture
def comm():
    c = col.init(backend="mpi", timeout=20.0)
    yield c
    c.close()


def _inputs(count: int, dtype=np.float32) -> list[np.ndarray]:
    """Each rank's x, (2, count), as every rank can compute them."""
    return [(np.arange(2 * count) % 5 + 1 + r).astype(dtype).reshape(2, count) for r in (0, 1)]


def _finish(result, async_op):
    return result.wait() if async_op else result


def _libmpi_has(symbol: str) -> bool:
    """Whether the libmpi that mpi4py loaded (Linux: found in /proc/self/maps) has ``symbol``."""
    with open("/proc/self/maps") as maps:
        paths = {
            line.rsplit(None, 1)[-1]
            for line in maps
            if re.search(r"/libmpi(_[a-z]+)?\.so", line)  # not libmpifort, libmpicxx
        }
    return any(hasattr(ctypes.CDLL(path), symbol) for path in paths)


def test_the_mpi_libraries_of_ci_make_the_exchange():
    # The exchange is made where mpi4py 4 and the MPI library have MPI_Isendrecv (MPI 4.0):
    # all three MPIs in CI, so that the tests below test it.
    if not hasattr(MPI.Comm, "Isendrecv"):
        pytest.skip("mpi4py before 4.0 (no Isendrecv): MPI's reduce_scatter is made")
    assert _libmpi_has("MPI_Isendrecv") and _libmpi_has("MPI_Reduce_local")


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in_place"])
def test_the_exchange_never_meets_a_users_message(comm, async_op, in_place):
    # rank 0 sends rank 1 a message of the very size of the part rank 1 gets in the
    # exchange, before the reduce_scatter; rank 1 receives it only after: under the tag of
    # send/recv, rank 1's exchange would take rank 0's message instead
    count = 40_000  # 160 KB a rank
    rank = comm.rank
    stack = _inputs(count)
    x = stack[rank].copy()
    message = np.full(count, -7.0, np.float32)
    sent = comm.send(message, 1, async_op=True) if rank == 0 else None
    out = x[rank] if in_place else np.empty(count, np.float32)
    got = _finish(comm.reduce_scatter(x, out=out, async_op=async_op), async_op)
    np.testing.assert_array_equal(got, stack[0][rank] + stack[1][rank])
    if rank == 1:
        received = comm.recv(np.zeros(count, np.float32), 0)
        np.testing.assert_array_equal(received, message)
    else:
        sent.wait()


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("general_rank", [0, 1])
def test_ranks_meet_in_the_exchange_whatever_arrays_each_passes(comm, async_op, general_rank):
    # one rank's x is of another type (a subclass), at small and large sizes
    rank = comm.rank
    for count in (1, 2, 257, 70_000):
        for op, dtype in (("sum", np.float32), ("max", np.int64), ("avg", np.float64)):
            stack = _inputs(count, dtype)
            reduced = {"sum": np.add, "max": np.maximum, "avg": np.add}[op](
                stack[0][rank], stack[1][rank]
            )
            expected = reduced / 2 if op == "avg" else reduced
            for in_place in (False, True):
                x = stack[rank].copy()
                given = x.view(Tagged) if rank == general_rank else x
                out = given[rank] if in_place else None
                work = comm.reduce_scatter(given, op, out=out, async_op=async_op)
                got = np.asarray(_finish(work, async_op))
                what = f"{op} {dtype.__name__} x {count}, in place {in_place}"
                np.testing.assert_array_equal(got, expected, err_msg=what)
                np.testing.assert_array_equal(x[1 - rank], stack[rank][1 - rank], err_msg=what)


def test_exchanges_in_a_group_complete_with_it(comm):
    rank, count = comm.rank, 30_000
    stack = _inputs(count)
    xs = [stack[rank] * (i + 1) for i in range(3)]
    with comm.group():
        slots = [comm.reduce_scatter(x, out=x[rank]) for x in xs]
    for i, slot in enumerate(slots):
        np.testing.assert_array_equal(slot, (stack[0][rank] + stack[1][rank]) * (i + 1))
    MPI.COMM_WORLD.Barrier()
