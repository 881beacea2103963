"""Max and min give the same bits on every rank (the MPI backend's own max and min): NaN placed
differently on each rank, +0.0 against -0.0, every form of the MPI backend's calls (blocking
and not, async, in place, the two-rank exchange of reduce_scatter, bfloat16 and float16
reduced through float32, the hierarchical view).

Each result is compared byte for byte across ranks (every rank's bytes gathered with mpi4py)
and against ``numpy.maximum.reduce`` / ``numpy.minimum.reduce`` over the ranks' inputs, with
a NaN as ``np.nan``'s bits and ``max(+0, -0) = +0``, ``min(+0, -0) = -0``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col
import ddp

WORLD_SIZES = (2, 3)
SPMD_TIMEOUT = 180
pytestmark = pytest.mark.numpy_only(reason="the MPI backend's reduction of NumPy arrays")

WORLD = MPI.COMM_WORLD
#: the values each position takes on a rank: every pair and triple of ranks meets each
#: combination of NaN (either sign), zeros of either sign and numbers at some position
CHOICES = np.array([np.nan, -np.nan, 0.0, -0.0, 1.0, -1.0, np.inf, -np.inf], np.float64)
CHOICES[1] = math.copysign(math.nan, -1.0)


class Tagged(np.ndarray):
    """A NumPy subclass: the same calls as a plain array's."""


def _values(rank: int, count: int) -> np.ndarray:
    """Rank ``rank``'s input: position j takes CHOICES[(j // 8**rank) % 8]."""
    j = np.arange(count)
    return CHOICES[(j // 8**rank) % len(CHOICES)]


def _expected(stack: np.ndarray, op: str) -> np.ndarray:
    """numpy's reduction over the ranks, with the NaN and zero rules."""
    pick = np.maximum if op == "max" else np.minimum
    result = pick.reduce(stack, axis=0)
    zero = stack == 0
    positive_zero = (zero & ~np.signbit(stack)).any(axis=0)
    negative_zero = (zero & np.signbit(stack)).any(axis=0)
    signed = positive_zero if op == "max" else ~negative_zero
    result = np.where(result == 0, np.where(signed, 0.0, -0.0), result)
    result[np.isnan(result)] = np.nan
    return result.astype(stack.dtype)


def _bits_alike(result: np.ndarray, expected: np.ndarray) -> None:
    mine = np.ascontiguousarray(result).tobytes()
    every = WORLD.allgather(mine)
    assert all(b == every[0] for b in every), "ranks got different bits"
    assert mine == np.ascontiguousarray(expected).tobytes(), (result, expected)


def _as(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "bfloat16":
        return col.float32_to_bfloat16(values.astype(np.float32))
    return values.astype(dtype)


def _wrap(x: np.ndarray, dtype: str, path: str) -> np.ndarray:
    if path == "general":
        x = x.view(Tagged)
    return col.as_bfloat16(x) if dtype == "bfloat16" else x


def _inputs(comm, count: int, dtype: str):
    stack = np.stack([_values(r, count) for r in range(comm.size)])
    if dtype == "bfloat16":
        stack32 = stack.astype(np.float32)
        return _as(stack[comm.rank], dtype), col.float32_to_bfloat16(stack32)
    return _as(stack[comm.rank], dtype), stack.astype(dtype)


def _expected_of(stack: np.ndarray, dtype: str, op: str) -> np.ndarray:
    if dtype == "bfloat16":
        wide = col.bfloat16_to_float32(stack)
        return col.float32_to_bfloat16(_expected(wide, op))
    return _expected(stack, op)


def _done(result, async_op: bool):
    return result.wait() if async_op else result


DTYPES = ["float32", "float64", "float16", "bfloat16"]
#: 8 elements and 40,000: small and large calls, and the two-rank exchange of reduce_scatter
COUNTS = [8, 40_000]


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("path", ["direct", "general"])
@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in_place"])
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_all_reduce_gives_every_rank_the_same_bits(
    comm, dtype, op, in_place, async_op, path, count
):
    x, stack = _inputs(comm, max(count, 8**comm.size), dtype)
    out = x if in_place else np.empty_like(x)
    # calls of `count` elements (8: the few that are combined on Python floats)
    for start in range(0, x.size, count):
        part, into = x[start : start + count], out[start : start + count]
        result = comm.all_reduce(
            _wrap(part, dtype, path),
            op=op,
            out=None if in_place else _wrap(into, dtype, path),
            async_op=async_op,
        )
        _done(result, async_op)
    _bits_alike(out, _expected_of(stack, dtype, op))


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("path", ["direct", "general"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "in_place"])
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_scatter_gives_the_same_bits(comm, dtype, op, in_place, path, count):
    count = max(count, 8**comm.size)
    count -= count % comm.size
    x, stack = _inputs(comm, count, dtype)
    x = x.reshape(comm.size, -1)
    mine = x[comm.rank] if in_place else np.empty_like(x[0])
    comm.reduce_scatter(_wrap(x, dtype, path), op=op, out=_wrap(mine, dtype, path))
    whole = np.empty_like(x)
    WORLD.Allgather(np.ascontiguousarray(mine), whole)
    expected = _expected_of(stack, dtype, op).reshape(comm.size, -1)
    assert whole.tobytes() == expected.tobytes()


@pytest.mark.parametrize("count", COUNTS)
@pytest.mark.parametrize("root", [0, -1], ids=["root0", "last"])
@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_reduce_gives_the_root_numpys_result(comm, dtype, op, root, count):
    root %= comm.size
    count = max(count, 8**comm.size)
    x, stack = _inputs(comm, count, dtype)
    out = np.empty_like(x)
    comm.reduce(_wrap(x, dtype, "direct"), root, op=op, out=_wrap(out, dtype, "direct"))
    if comm.rank == root:
        assert out.tobytes() == _expected_of(stack, dtype, op).tobytes()


@pytest.mark.parametrize("op", ["max", "min"])
def test_the_hierarchical_view_gives_the_same_bits(comm, op):
    count = 8**comm.size
    x, stack = _inputs(comm, count, "float32")
    with col.hierarchical(comm, ranks_per_node=2) as view:
        view.all_reduce(x, op=op)
    _bits_alike(x, _expected_of(stack, "float32", op))


def test_an_infinity_norm_over_a_nan_is_nan_on_every_rank(comm):
    # the issue's case: rank 0's shard holds a NaN, another's a larger finite gradient
    grads = [np.array([np.nan, 1.0]) if comm.rank == 0 else np.array([1.0, -2.0])]
    norm = ddp.clip_grad_norm(grads, 1.0, comm, norm_type=math.inf)
    norms = WORLD.allgather(norm)
    assert all(math.isnan(n) for n in norms), norms


def test_an_infinity_norm_sees_a_nan_in_any_array(comm):
    # Python's max() keeps its first operand against a NaN: a NaN after a number was lost
    grads = [np.array([1.0]), np.array([np.nan])]
    shared = [np.array([3.0]), np.array([np.nan])]
    assert math.isnan(ddp.clip_grad_norm(grads, 1.0, norm_type=math.inf))
    assert math.isnan(ddp.clip_grad_norm([], 1.0, comm, replicated=shared, norm_type=math.inf))
