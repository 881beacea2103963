"""Ranks meet in a call whatever kind of array each passes: rank 0 passes a NumPy subclass,
a DLPack object, a view of a larger array or ml_dtypes' bfloat16, the other ranks plain
arrays (``as_bfloat16`` bits for bfloat16), and every verb gives every rank the right result,
synchronous or not, on blocking and non-blocking communicators. Which MPI call a rank makes
depends only on what every rank agrees on, never on a rank-local Python type: a rank that
made a different call would wait for its peers until the timeout.
"""

from __future__ import annotations

import numpy as np
import pytest

import collectives as col

pytestmark = pytest.mark.numpy_only("kinds of NumPy arrays on the MPI backend")
WORLD_SIZES = (2, 3)
SPMD_TIMEOUT = 300


class Sub(np.ndarray):
    """A trivial NumPy subclass."""


class DLPackOnly:
    """An array object known by its DLPack protocol alone (as a torch or JAX CPU array)."""

    def __init__(self, array: np.ndarray):
        self._array = array

    def __dlpack__(self, *args, **kwargs):
        return self._array.__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


KINDS = ["subclass", "dlpack", "view", "bfloat16"]


def dressed(kind: str, array: np.ndarray, rank: int):
    """``array`` as rank ``rank`` passes it: rank 0 in the kind under test, the others plain
    (bfloat16: ml_dtypes' dtype on rank 0, ``as_bfloat16`` of the same bits elsewhere)."""
    if kind == "bfloat16":
        import ml_dtypes

        bits = array.astype(np.float32).astype(ml_dtypes.bfloat16)
        return bits if rank == 0 else col.as_bfloat16(bits.view(np.uint16))
    if rank != 0:
        return array
    if kind == "subclass":
        return array.view(Sub)
    if kind == "dlpack":
        return DLPackOnly(array)
    larger = np.empty((2, *array.shape), array.dtype)  # a view that is not its own base
    larger[1] = array
    return larger[1]


def values(kind: str, given, result) -> np.ndarray:
    """The result as float64 values, whatever form the call gave it in."""
    if kind == "bfloat16":
        bits = result.array if isinstance(result, col.BFloat16Array) else result
        return col.bfloat16_to_float32(np.asarray(bits).view(np.uint16)).astype(np.float64)
    if isinstance(given, DLPackOnly) and result is given:
        result = given._array
    return np.asarray(result, np.float64)


@pytest.fixture(params=[True, False], ids=["blocking", "non-blocking"])
def comm(request):
    c = col.init(backend="mpi", timeout=20, mpi_blocking=request.param)
    yield c
    c.close()


def _done(result, async_op: bool):
    return result.wait() if async_op else result


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("kind", KINDS)
def test_every_verb_with_one_rank_passing_another_kind(comm, kind, async_op):
    size, rank = comm.size, comm.rank
    root = size - 1
    base = np.arange(6, dtype=np.float32) % 4 + 1  # small integers: exact in bfloat16

    def mine(r: int) -> np.ndarray:
        return base + r

    every = np.stack([mine(r) for r in range(size)]).astype(np.float64)

    def call(name: str, make, check) -> None:
        x = dressed(kind, mine(rank), rank)
        result = _done(make(x), async_op)
        check(values(kind, x, result) if result is not None else None, name)

    def equal(expected):
        return lambda got, name: np.testing.assert_array_equal(got, expected, err_msg=name)

    call("all_reduce", lambda x: comm.all_reduce(x, async_op=async_op), equal(every.sum(0)))
    call(
        "all_reduce max",
        lambda x: comm.all_reduce(x, "max", async_op=async_op),
        equal(every.max(0)),
    )
    call(
        "broadcast",
        lambda x: comm.broadcast(x, root, async_op=async_op),
        equal(every[root]),
    )
    reduced = every.sum(0) if rank == root else every[rank]
    call("reduce", lambda x: comm.reduce(x, root, async_op=async_op), equal(reduced))
    call("all_gather", lambda x: comm.all_gather(x, async_op=async_op), equal(every))

    stacked = np.stack([base + 10 * r for r in range(size)])  # part r for rank r

    def parts(r: int) -> np.ndarray:
        return (stacked + r).astype(np.float32)

    expected_part = sum(parts(r)[rank] for r in range(size)).astype(np.float64)
    for name, verb in (
        ("reduce_scatter", lambda x: comm.reduce_scatter(x, async_op=async_op)),
        ("all_to_all", lambda x: comm.all_to_all(x, async_op=async_op)),
    ):
        x = dressed(kind, parts(rank), rank)
        got = values(kind, x, _done(verb(x), async_op))
        if name == "reduce_scatter":
            np.testing.assert_array_equal(got, expected_part, err_msg=name)
        else:
            from_each = np.stack([parts(r)[rank] for r in range(size)]).astype(np.float64)
            np.testing.assert_array_equal(got, from_each, err_msg=name)

    x = dressed(kind, mine(rank), rank)
    gathered = _done(comm.gather(x, root, async_op=async_op), async_op)
    if rank == root:
        np.testing.assert_array_equal(values(kind, x, gathered), every, err_msg="gather")
    x = dressed(kind, parts(root), rank)
    scattered = _done(comm.scatter(x, root, async_op=async_op), async_op)
    np.testing.assert_array_equal(
        values(kind, x, scattered), parts(root)[rank].astype(np.float64), err_msg="scatter"
    )
    x = dressed(kind, mine(rank), rank)
    left = _done(
        comm.sendrecv(x, (rank + 1) % size, source=(rank - 1) % size, async_op=async_op), async_op
    )
    np.testing.assert_array_equal(
        values(kind, x, left), every[(rank - 1) % size], err_msg="sendrecv"
    )
    _done(comm.barrier(async_op=async_op), async_op)


def test_a_subclass_on_one_rank_meets_plain_arrays_in_a_small_all_reduce():
    # the hang this rule came from: 2 ranks, an 8-byte synchronous all_reduce, rank 0's array a
    # trivial subclass; every rank must get the sum well within the timeout
    comm = col.init(backend="mpi", timeout=5)
    for _ in range(3):
        x = np.full(1, comm.rank + 1.0)
        comm.all_reduce(x.view(Sub) if comm.rank == 0 else x)
        np.testing.assert_array_equal(x, sum(range(1, comm.size + 1)))
    comm.close()
