"""Benchmark data whose every result is exact in its dtype, and the expected results.

Rank ``r``'s buffer holds, at flat index ``i``, a small integer that depends on ``r`` and
``i`` and is chosen per reduce op so that the reduction over any number of ranks stays exact
even in float16 (sums of values below 4, products of 1s and 2s, averages of data whose sum is
a multiple of the rank count). Every pattern is periodic in ``i`` with a short period, so
a buffer or the expected result of a 1 GiB collective costs a few hundred elements of
arithmetic plus one ``np.tile`` (about a memory copy: 0.2 s a GiB on a small machine).
"""

from __future__ import annotations

import math

import numpy as np

from collectives import InvalidArgumentError

#: nccl-tests' type names (``-d`` and the ``type`` column), in its order, and their storage
NCCL_TYPES = {
    "int8": "int8", "uint8": "uint8", "int32": "int32", "uint32": "uint32", "int64": "int64",
    "uint64": "uint64", "half": "float16", "float": "float32", "double": "float64",
    "bfloat16": "bfloat16",
}  # fmt: skip
DTYPES = ("float16", "float32", "float64", "int8", "uint8", "int32", "uint32", "int64", "uint64")
REDOPS = ("sum", "prod", "max", "min", "avg")
#: bfloat16 data: uint16 bits (NumPy and CuPy have no bfloat16), marked so that it is told
#: apart from uint16 and handed to the collectives wrapped in ``as_bfloat16``
BFLOAT16 = np.dtype(np.uint16, metadata={"bfloat16": True})


def is_bfloat16(dtype: np.dtype) -> bool:
    return bool((dtype.metadata or {}).get("bfloat16"))


def storage_dtype(name: str) -> np.dtype:
    """The dtype of the buffers for a type name, nccl-tests' or NumPy's.

    Example:
        >>> storage_dtype("half"), storage_dtype("float32")
        (dtype('float16'), dtype('float32'))
    """
    name = NCCL_TYPES.get(name, name)
    if name == "bfloat16":
        return BFLOAT16
    if name not in DTYPES:
        raise InvalidArgumentError(
            f"benchmark: dtype (-d) must be one of {', '.join(NCCL_TYPES)}, got {name!r}"
        )
    return np.dtype(name)


def type_name(dtype: np.dtype) -> str:
    """nccl-tests' name for a storage dtype: ``float``, ``half``, ``bfloat16``..."""
    if is_bfloat16(dtype):
        return "bfloat16"
    return next(nccl for nccl, numpy in NCCL_TYPES.items() if numpy == dtype.name)


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype the patterns are computed in: float32 for bfloat16 (exact, then truncated)."""
    return np.dtype(np.float32) if is_bfloat16(dtype) else dtype


def _cast(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    if is_bfloat16(dtype):
        # the top half of a float32 is its bfloat16; exact for the small integers used here
        return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return values.astype(dtype)


def _exact_limit(dtype: np.dtype) -> int:
    """The largest integer every value up to which the dtype holds exactly."""
    if is_bfloat16(dtype):
        return 256
    if dtype.kind == "f":
        return 2 ** (np.finfo(dtype).nmant + 1)
    return int(np.iinfo(dtype).max)


def _pattern(kind: str, rank: int, size: int, dtype: np.dtype) -> np.ndarray:
    """One period of rank ``rank``'s data for reduce op ``kind`` (``"none"``: no reduction)."""
    if kind == "sum":
        modulus = max(1, min(4, _exact_limit(dtype) // size + 1))
        values = (np.arange(modulus) + rank) % modulus
    elif kind == "prod":
        values = 1 + ((np.arange(4) + rank) % 4 == 0)
    elif kind in ("max", "min"):
        values = (np.arange(7) + 3 * rank) % 7
    elif kind == "avg":
        # base + d where d is +1 on one rank and -1 on another: the sum is size * base
        i = np.arange(math.lcm(3, size))
        values = i % 3 + 1
        if size > 1:
            values = values + (i % size == rank) - ((i + 1) % size == rank)
    elif kind == "none":
        values = (np.arange(97) + 31 * rank) % 97
    else:
        raise InvalidArgumentError(
            f"benchmark: reduce op (-o) must be one of {', '.join(REDOPS)}, got {kind!r}"
        )
    return _cast(values, _compute_dtype(dtype))


def _stretch(period: np.ndarray, start: int, length: int) -> np.ndarray:
    """``period`` repeated to ``length`` elements, starting at its element ``start``.

    ``np.tile`` copies whole blocks; ``np.resize`` would concatenate one small array per
    period (minutes for a GiB).
    """
    rolled = np.roll(period, -(start % period.size))
    return np.tile(rolled, -(-length // period.size))[:length]


def values(kind: str, rank: int, size: int, dtype: np.dtype, start: int, length: int) -> np.ndarray:
    """Rank ``rank``'s data at flat indices ``[start, start + length)``.

    Example:
        >>> values("none", 1, 2, np.dtype("int32"), 0, 4)
        array([31, 32, 33, 34], dtype=int32)
    """
    return _stretch(_cast(_pattern(kind, rank, size, dtype), dtype), start, length)


def reduced(kind: str, size: int, dtype: np.dtype, start: int, length: int) -> np.ndarray:
    """The reduction over all ranks of ``values(kind, r, ...)``, computed in ``dtype``.

    Example:
        >>> reduced("sum", 2, np.dtype("float16"), 0, 4)
        array([1., 3., 5., 3.], dtype=float16)
    """
    periods = [_pattern(kind, r, size, dtype) for r in range(size)]
    if kind == "avg":
        result = (np.arange(periods[0].size) % 3 + 1).astype(_compute_dtype(dtype))
    else:
        combine = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[kind]
        result = periods[0].copy()
        for period in periods[1:]:
            combine(result, period, out=result)
    return _stretch(_cast(result, dtype), start, length)


def sentinel(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """A receive buffer no correct result matches: NaN, or the integer maximum."""
    if is_bfloat16(dtype):
        return np.full(shape, 0x7FC0, np.uint16)  # bfloat16 NaN
    fill = np.nan if dtype.kind == "f" else np.iinfo(dtype).max
    return np.full(shape, fill, dtype)


def send_data(
    op: str, kind: str, rank: int, size: int, dtype: np.dtype, count: int, root: int
) -> np.ndarray:
    """What rank ``rank`` sends for one call of ``op`` with per-call ``count``.

    Shapes follow the collectives API: ``(size, count)`` where each rank sends one block
    per rank (reduce_scatter, all_to_all, scatter), ``(count,)`` otherwise.
    """
    if op in ("reduce_scatter", "all_to_all", "scatter"):
        return values(kind, rank, size, dtype, 0, size * count).reshape(size, count)
    return values(kind, rank, size, dtype, 0, count)


def expected(
    op: str, kind: str, rank: int, size: int, dtype: np.dtype, count: int, root: int
) -> np.ndarray | None:
    """What rank ``rank`` must hold after one call of ``op``; None where nothing is defined.

    Example:
        >>> expected("all_gather", "none", 0, 2, np.dtype("int8"), 2, 0)
        array([[ 0,  1],
               [31, 32]], dtype=int8)
    """
    if op == "all_reduce" or (op == "reduce" and rank == root):
        return reduced(kind, size, dtype, 0, count)
    if op == "reduce_scatter":
        return reduced(kind, size, dtype, rank * count, count)
    if op == "broadcast":
        return values(kind, root, size, dtype, 0, count)
    if op in ("all_gather", "hypercube") or (op == "gather" and rank == root):
        return np.stack([values(kind, r, size, dtype, 0, count) for r in range(size)])
    if op == "all_to_all":
        return np.stack([values(kind, r, size, dtype, rank * count, count) for r in range(size)])
    if op == "scatter":
        return values(kind, root, size, dtype, rank * count, count)
    if op == "sendrecv":
        return values(kind, (rank - 1) % size, size, dtype, 0, count)
    return None


def count_wrong(result, want: np.ndarray | None) -> int:
    """Elements of ``result`` (NumPy or CuPy) that differ from ``want`` (0 when None)."""
    if want is None or result is None:
        return 0
    host = result.get() if hasattr(result, "get") else np.asarray(result)
    if host.shape != want.shape:
        return int(want.size)
    return int(np.count_nonzero(host != want))
