"""Max and min that give the same bits on every rank, for every MPI library.

MPI's own ``MPI_MAX`` and ``MPI_MIN`` keep one operand or the other where the two compare
unordered or equal (a NaN against a number, +0.0 against -0.0), and ranks combine their
operands in different orders: with rank 0 ``[nan, 1]`` and rank 1 ``[1, nan]`` an
``all_reduce(op="max")`` gave ``[1, nan]`` on one rank and ``[nan, 1]`` on the other. These
are user-defined MPI ops (commutative) whose result does not depend on the order:

- a NaN on any rank gives NaN, as ``numpy.maximum`` / ``numpy.minimum`` do; always the
  dtype's positive quiet NaN (``np.nan``'s bits), whichever NaN came in;
- ``max(+0.0, -0.0)`` is +0.0 and ``min(+0.0, -0.0)`` is -0.0;
- otherwise the larger (smaller) value, whose bits are unique.

That is the maximum (minimum) of a total order, so any tree of combinations gives the same
bits. Integers take ``numpy.maximum`` / ``numpy.minimum`` (exact). Every MPI path takes these
ops (``tables.MPI_OP``), whatever the dtype:
bfloat16, and float16 where MPI has no float16, are reduced in float32 and rounded after.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

#: elements combined at a time: the temporaries stay in cache (a 1 MiB float32 call took
#: about half as long in pieces of this size as in one piece, 2 cores, loaded)
_PIECE = 1 << 14


def _dtypes() -> dict[int, np.dtype]:
    """MPI datatype handle -> the NumPy dtype it reduces (those in ``tables.MPI_TYPE``)."""
    pairs = [
        ("INT8_T", np.int8),
        ("UINT8_T", np.uint8),
        ("INT32_T", np.int32),
        ("UINT32_T", np.uint32),
        ("INT64_T", np.int64),
        ("UINT64_T", np.uint64),
        ("FLOAT16_T", np.float16),
        ("FLOAT", np.float32),
        ("DOUBLE", np.float64),
    ]
    table = {}
    for name, dtype in pairs:
        t = getattr(MPI, name, MPI.DATATYPE_NULL)
        if t != MPI.DATATYPE_NULL:
            table[MPI._handleof(t)] = np.dtype(dtype)
    return table


_DTYPE = _dtypes()
#: float dtype -> (the unsigned integer dtype of its bits, its positive quiet NaN)
_FLOAT = {
    dtype: (np.dtype(f"u{dtype.itemsize}"), dtype.type(np.nan))
    for dtype in _DTYPE.values()
    if dtype.kind == "f"
}
#: up to this many elements, the rules run on Python floats: a few NumPy calls cost more
#: (an 8-byte all_reduce of 2 ranks took 26 us with them against 8 us for MPI_MAX)
_FEW = 8


def _float_piece(
    a: np.ndarray, b: np.ndarray, pick: np.ufunc, ties: np.ufunc, bits: np.dtype, nan: Any
) -> None:
    """``b = pick(a, b)`` by the rules above: ``ties`` (bitwise and for max, or for min)
    settles +0.0 against -0.0; a NaN becomes ``nan``."""
    a_bits, b_bits = a.view(bits), b.view(bits)
    equal = a == b  # equal values have equal bits, but for the two zeros
    tied = ties(a_bits, b_bits)
    pick(a, b, out=b)
    np.copyto(b_bits, tied, where=equal)
    np.copyto(b, nan, where=b != b)


def _few(a: np.ndarray, b: np.ndarray, larger: bool) -> None:
    """The rules above on Python floats (exact: each value is one of the dtype's)."""
    result = []
    for x, y in zip(a.tolist(), b.tolist()):
        if x != x or y != y:
            result.append(math.nan)  # stored as the dtype's positive quiet NaN
        elif x == 0 and y == 0:  # max is -0.0 where both are, min where either is
            signs = (math.copysign(1.0, x) < 0, math.copysign(1.0, y) < 0)
            result.append(-0.0 if (all(signs) if larger else any(signs)) else 0.0)
        else:
            result.append(max(x, y) if larger else min(x, y))
    b[:] = result


def _op(pick: np.ufunc, ties: np.ufunc) -> Callable[[Any, Any, MPI.Datatype], None]:
    larger = pick is np.maximum

    def combine(inbuf: Any, inoutbuf: Any, datatype: MPI.Datatype) -> None:
        dtype = _DTYPE[MPI._handleof(datatype)]
        a, b = np.frombuffer(inbuf, dtype), np.frombuffer(inoutbuf, dtype)
        if dtype.kind != "f":
            pick(a, b, out=b)
        elif a.size <= _FEW:
            _few(a, b, larger)
        else:
            bits, nan = _FLOAT[dtype]
            for start in range(0, a.size, _PIECE):
                end = start + _PIECE
                _float_piece(a[start:end], b[start:end], pick, ties, bits, nan)

    return combine


#: the ops :func:`ops` made (max, min), once
_OPS: list[MPI.Op] = []


def ops() -> tuple[MPI.Op, MPI.Op]:
    """``MPI_MAX`` and ``MPI_MIN`` with the same bits on every rank (above), made on the first
    call (``tables.mpi_tables``), not at import: ``MPI_Op_create`` is an MPI call."""
    if not _OPS:
        _OPS.extend(
            [
                MPI.Op.Create(_op(np.maximum, np.bitwise_and), commute=True),
                MPI.Op.Create(_op(np.minimum, np.bitwise_or), commute=True),
            ]
        )
    return _OPS[0], _OPS[1]
