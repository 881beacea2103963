"""Copy many gradients into a bucket's flat buffer and back, in one pass per bucket.

On the GPU one elementwise kernel walks the flat buffer and finds each element's source (or
destination) tensor by binary search over the offsets, so a bucket of a hundred tensors
costs one launch, not a hundred. The kernel copies bit patterns of the element size, so one
compiled kernel serves every dtype of that size. NumPy packs with one ``concatenate``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from collectives import array_module

_KERNELS: dict[str, Any] = {}
_BITS = {1: "uint8", 2: "uint16", 4: "uint32", 8: "uint64", 16: "complex128"}

_SEARCH = """
    ptrdiff_t lo = 0, hi = n_tensors;
    while (lo < hi - 1) {
        ptrdiff_t mid = (lo + hi) / 2;
        if (i < offsets[mid]) hi = mid; else lo = mid;
    }
"""


def _kernel(direction: str):
    """``pack``: y[i] = tensor[j][i - off[j]]; ``unpack``: the reverse (y is read)."""
    if direction not in _KERNELS:
        import cupy

        body = _SEARCH + (
            "y = reinterpret_cast<const T*>(ptrs[lo])[i - offsets[lo]];"
            if direction == "pack"
            else "reinterpret_cast<T*>(ptrs[lo])[i - offsets[lo]] = y;"
        )
        _KERNELS[direction] = cupy.ElementwiseKernel(
            "raw int64 ptrs, raw int64 offsets, int64 n_tensors",
            "T y",
            body,
            f"ddp_bucket_{direction}",
        )
    return _KERNELS[direction]


class _PointerTable:
    """Device copies of (pointers, offsets), cached while the same arrays come back."""

    def __init__(self) -> None:
        self._key: tuple[int, ...] | None = None
        self._tables: Any = None

    def get(self, arrays: list[Any], offsets: tuple[int, ...]) -> tuple[Any, Any]:
        import cupy

        key = tuple(a.data.ptr for a in arrays)
        if key != self._key:
            self._tables = (
                cupy.asarray(np.array(key, dtype=np.int64)),
                cupy.asarray(np.array(offsets, dtype=np.int64)),
            )
            self._key = key
        return self._tables


def _fusable(buffer: Any, arrays: list[Any]) -> bool:
    return all(a.flags.c_contiguous and a.dtype == buffer.dtype for a in arrays) and (
        buffer.dtype.itemsize in _BITS
    )


def _bits_view(buffer: Any) -> Any:
    return buffer.view(_BITS[buffer.dtype.itemsize])


def pack(bucket: Any, arrays: list[Any], table: _PointerTable) -> None:
    """Copy ``arrays`` (in ``bucket.names`` order) into ``bucket.buffer``."""
    buffer = bucket.buffer
    if array_module(buffer) is np:
        np.concatenate([np.asarray(a).ravel() for a in arrays], out=buffer)
        return
    if not _fusable(buffer, arrays) or len(arrays) == 1:
        for name, a in zip(bucket.names, arrays):
            bucket.views[name][...] = a
        return
    ptrs, offsets = table.get(arrays, bucket.offsets)
    _kernel("pack")(ptrs, offsets, len(arrays), _bits_view(buffer))


def unpack(bucket: Any, arrays: list[Any], table: _PointerTable) -> None:
    """Copy ``bucket.buffer`` back into ``arrays`` (in ``bucket.names`` order)."""
    buffer = bucket.buffer
    if array_module(buffer) is not np and _fusable(buffer, arrays) and len(arrays) > 1:
        ptrs, offsets = table.get(arrays, bucket.offsets)
        _kernel("unpack")(ptrs, offsets, len(arrays), _bits_view(buffer))
        return
    for name, a in zip(bucket.names, arrays):
        a[...] = bucket.views[name]
