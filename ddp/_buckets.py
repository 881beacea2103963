"""Bucket layout: which gradients share a flat buffer, and the buffers themselves.

The assignment is a pure function of the parameters' names, shapes and dtypes, so it is the
same on every rank and can be tested with no communicator. A :class:`Bucket` owns one flat
buffer; every gradient of the bucket is a view into it, so writing a gradient writes the
buffer and a reduction of the buffer reduces them all with no copy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from collectives import InvalidArgumentError

_MB = 1 << 20


@dataclass(frozen=True)
class BucketSpec:
    """Where each gradient of one bucket lives in its flat buffer (all in elements)."""

    index: int
    names: tuple[str, ...]
    dtype: np.dtype
    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...]
    numel: int

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize


def _describe(value: Any) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) of an array, or of a ``(shape, dtype)`` pair."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return tuple(int(n) for n in value.shape), np.dtype(value.dtype)
    shape, dtype = value
    return tuple(int(n) for n in shape), np.dtype(dtype)


def assign_buckets(
    params: Mapping[str, Any], bucket_cap_mb: float = 25.0, first_bucket_cap_mb: float = 1.0
) -> list[BucketSpec]:
    """Group parameters into buckets, in the order their reductions should start.

    ``params`` maps names, in model order, to arrays or ``(shape, dtype)`` pairs. Parameters
    are visited in reverse model order (backward produces the last layers' gradients first)
    and appended to the open bucket of their dtype; a bucket is closed before it would pass
    its cap, so every bucket respects the cap unless it holds a single larger parameter. The
    first bucket of each dtype has the smaller ``first_bucket_cap_mb`` so that communication
    starts early. Buckets are returned sorted by when they fill up in a reverse-order
    backward pass (that is, by the last parameter assigned to them).

    Example (caps in MiB; 1 MiB holds 262144 float32 values):
        >>> mb = 262144
        >>> specs = assign_buckets(
        ...     {"a": ((mb,), "f4"), "b": ((mb,), "f4"), "c": ((mb // 2,), "f4"),
        ...      "d": ((mb // 2,), "f4")}, bucket_cap_mb=2, first_bucket_cap_mb=1)
        >>> [s.names for s in specs]
        [('d', 'c'), ('b', 'a')]
    """
    if bucket_cap_mb <= 0 or not math.isfinite(bucket_cap_mb):
        raise InvalidArgumentError(
            f"assign_buckets: bucket_cap_mb must be > 0, got {bucket_cap_mb}"
        )
    if first_bucket_cap_mb <= 0 or not math.isfinite(first_bucket_cap_mb):
        raise InvalidArgumentError(
            f"assign_buckets: first_bucket_cap_mb must be > 0, got {first_bucket_cap_mb}"
        )
    items = [(name, *_describe(value)) for name, value in params.items()]
    order = {name: i for i, (name, _, _) in enumerate(reversed(items))}
    closed: list[list[tuple[str, tuple[int, ...], np.dtype]]] = []
    open_: dict[np.dtype, list[tuple[str, tuple[int, ...], np.dtype]]] = {}
    open_bytes: dict[np.dtype, int] = {}
    first_done: set[np.dtype] = set()

    for name, shape, dtype in reversed(items):
        nbytes = math.prod(shape) * dtype.itemsize
        cap = (bucket_cap_mb if dtype in first_done else first_bucket_cap_mb) * _MB
        bucket = open_.get(dtype)
        if bucket and open_bytes[dtype] + nbytes > cap:
            closed.append(bucket)
            first_done.add(dtype)
            bucket = None
        if not bucket:
            bucket = open_[dtype] = []
            open_bytes[dtype] = 0
        bucket.append((name, shape, dtype))
        open_bytes[dtype] += nbytes
    closed.extend(b for b in open_.values() if b)
    closed.sort(key=lambda b: order[b[-1][0]])

    specs = []
    for index, bucket in enumerate(closed):
        offsets, numel = [], 0
        for _, shape, _ in bucket:
            offsets.append(numel)
            numel += math.prod(shape)
        specs.append(
            BucketSpec(
                index=index,
                names=tuple(n for n, _, _ in bucket),
                dtype=bucket[0][2],
                shapes=tuple(s for _, s, _ in bucket),
                offsets=tuple(offsets),
                numel=numel,
            )
        )
    return specs


class Bucket:
    """One flat buffer and the gradient views into it.

    Attributes:
        index: position in reduction order.
        names: the parameter names, in the order they were assigned.
        dtype: the dtype of every gradient in the bucket.
        shapes, offsets: each gradient's shape and its first element in ``buffer``.
        buffer: the flat NumPy/CuPy array the views share.
        views: name -> view of ``buffer`` with the parameter's shape.
    """

    def __init__(self, spec: BucketSpec, xp: Any):
        self.spec = spec
        self.index = spec.index
        self.names = spec.names
        self.dtype = spec.dtype
        self.shapes = spec.shapes
        self.offsets = spec.offsets
        self.buffer = xp.zeros(spec.numel, dtype=spec.dtype)
        self.views = {
            name: self.buffer[off : off + math.prod(shape)].reshape(shape)
            for name, shape, off in zip(spec.names, spec.shapes, spec.offsets)
        }

    @property
    def numel(self) -> int:
        return self.spec.numel

    @property
    def nbytes(self) -> int:
        return self.spec.nbytes

    def __repr__(self) -> str:
        return (
            f"Bucket(index={self.index}, {len(self.names)} tensors, dtype={self.dtype}, "
            f"nbytes={self.nbytes})"
        )


def make_buckets(specs: list[BucketSpec], xp: Any) -> list[Bucket]:
    """Allocate one zeroed flat buffer per spec with ``xp`` (NumPy or CuPy)."""
    return [Bucket(spec, xp) for spec in specs]
