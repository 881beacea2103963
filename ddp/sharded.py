"""ShardedArray: one array split along one axis across the ranks of a communicator.

Rank r holds the contiguous block ``[start_r, stop_r)`` of the split axis. Splits follow
``numpy.array_split``: when the length does not divide evenly, the first ``length % size``
ranks hold one element more. The pure range math (:func:`shard_ranges`) needs no
communicator and is shared with the tensor-parallel mappings.
"""

from __future__ import annotations

from typing import Any

from collectives import CommunicatorLike, InvalidArgumentError, array_module

from .checkpoint._shard import Shard

__all__ = ["ShardedArray", "shard_ranges", "even_shard_size"]


def shard_ranges(length: int, size: int) -> list[tuple[int, int]]:
    """The ``(start, stop)`` block of each rank when ``length`` items are split over ``size``.

    Example: ``shard_ranges(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]``.
    """
    if size < 1:
        raise InvalidArgumentError(f"shard_ranges: size must be >= 1, got {size}")
    if length < 0:
        raise InvalidArgumentError(f"shard_ranges: length must be >= 0, got {length}")
    base, extra = divmod(length, size)
    ranges = []
    start = 0
    for r in range(size):
        stop = start + base + (1 if r < extra else 0)
        ranges.append((start, stop))
        start = stop
    return ranges


def even_shard_size(call: str, what: str, length: int, size: int) -> int:
    """``length // size``, or a clear error naming ``call`` and ``what`` when it is not exact.

    Example: ``even_shard_size("ColumnParallelLinear", "out_features", 12, 4) == 3``.
    """
    if length % size:
        raise InvalidArgumentError(
            f"{call}: {what} is {length}, expected a multiple of the group size {size}"
        )
    return length // size


def _normalize_axis(call: str, axis: int, ndim: int) -> int:
    if not -ndim <= axis < ndim:
        raise InvalidArgumentError(f"{call}: axis must be in [{-ndim}, {ndim}), got {axis}")
    return axis % ndim


def gather_along(x: Any, comm: CommunicatorLike, axis: int, lengths: list[int]) -> Any:
    """Concatenate every rank's ``x`` along ``axis``; rank r's block has ``lengths[r]`` items.

    Blocks of unequal length are padded to the longest for the all-gather (which needs one
    shape on every rank), then trimmed.

    Example: on 2 ranks holding ``[0, 1]`` and ``[2]``, ``gather_along(x, comm, 0, [2, 1])``
    returns ``[0, 1, 2]`` on both.
    """
    xp = array_module(x)
    longest = max(lengths)
    moved = xp.moveaxis(x, axis, 0)
    if moved.shape[0] != longest:
        padded = xp.zeros((longest, *moved.shape[1:]), dtype=x.dtype)
        padded[: moved.shape[0]] = moved
        moved = padded
    moved = xp.ascontiguousarray(moved)
    out = xp.empty((comm.size, *moved.shape), dtype=x.dtype)
    comm.all_gather(moved, out=out)
    if all(n == longest for n in lengths):
        full = out.reshape(comm.size * longest, *moved.shape[1:])
    else:
        full = xp.concatenate([out[r, :n] for r, n in enumerate(lengths)], axis=0)
    return xp.ascontiguousarray(xp.moveaxis(full, 0, axis))


class ShardedArray:
    """An array split along ``axis`` across ``comm``; this rank holds ``local``.

    Build one with :meth:`shard` (every rank holds the full array) or :meth:`from_local`
    (every rank holds only its block); :meth:`gather` rebuilds the full array on every rank.

    Example::

        x = np.arange(10.0)
        s = ShardedArray.shard(x, comm, axis=0)   # on 4 ranks: blocks of 3, 3, 2, 2
        s.shape, s.range, s.local                 # (10,), (0, 3), [0., 1., 2.] on rank 0
        assert (s.gather() == x).all()
    """

    def __init__(
        self, local: Any, comm: CommunicatorLike, axis: int, shape: tuple[int, ...]
    ) -> None:
        """Wrap ``local`` as this rank's block of a global array of ``shape``.

        Prefer :meth:`shard` or :meth:`from_local`, which check the pieces fit together.
        """
        self.comm = comm
        self.shape = tuple(int(n) for n in shape)
        self.axis = _normalize_axis("ShardedArray", axis, len(self.shape))
        self.ranges = shard_ranges(self.shape[self.axis], comm.size)
        expected = list(self.shape)
        start, stop = self.ranges[comm.rank]
        expected[self.axis] = stop - start
        if tuple(local.shape) != tuple(expected):
            raise InvalidArgumentError(
                f"ShardedArray: local has shape {tuple(local.shape)}, expected {tuple(expected)} "
                f"(block [{start}, {stop}) of axis {self.axis} of global shape {self.shape})"
            )
        self.local = local

    @classmethod
    def shard(cls, x: Any, comm: CommunicatorLike, axis: int = 0) -> ShardedArray:
        """Keep this rank's block of ``x`` (the same full array on every rank), as a copy.

        Example: ``ShardedArray.shard(np.ones((5, 2)), comm, axis=0).local.shape == (3, 2)``
        on rank 0 of 2.
        """
        xp = array_module(x)
        axis = _normalize_axis("ShardedArray.shard", axis, x.ndim)
        start, stop = shard_ranges(x.shape[axis], comm.size)[comm.rank]
        index = [slice(None)] * x.ndim
        index[axis] = slice(start, stop)
        return cls(xp.ascontiguousarray(x[tuple(index)]).copy(), comm, axis, x.shape)

    @classmethod
    def from_local(cls, local: Any, comm: CommunicatorLike, axis: int = 0) -> ShardedArray:
        """Assemble a ShardedArray from every rank's block (one small all-gather of shapes).

        The blocks must have the lengths :func:`shard_ranges` gives and agree on every other
        axis. Example: blocks of 3, 3, 2, 2 rows on 4 ranks make a global array of 10 rows.
        """
        xp = array_module(local)
        axis = _normalize_axis("ShardedArray.from_local", axis, local.ndim)
        # Shapes travel in the array's own module: an NCCL communicator takes no host arrays.
        mine = xp.asarray(local.shape, dtype=xp.int64)
        gathered = xp.empty((comm.size, local.ndim), dtype=xp.int64)
        comm.all_gather(mine, out=gathered)
        shapes = gathered.tolist()
        lengths = [row[axis] for row in shapes]
        others = {tuple(int(n) for i, n in enumerate(row) if i != axis) for row in shapes}
        if len(others) != 1:
            raise InvalidArgumentError(
                f"ShardedArray.from_local: blocks differ outside axis {axis}: shapes "
                f"{[tuple(row) for row in shapes]}"
            )
        expected = [b - a for a, b in shard_ranges(sum(lengths), comm.size)]
        if lengths != expected:
            raise InvalidArgumentError(
                f"ShardedArray.from_local: block lengths along axis {axis} are {lengths}, "
                f"expected {expected} (numpy.array_split order)"
            )
        shape = list(local.shape)
        shape[axis] = sum(lengths)
        return cls(local, comm, axis, tuple(shape))

    @property
    def range(self) -> tuple[int, int]:
        """This rank's ``(start, stop)`` along the split axis."""
        return self.ranges[self.comm.rank]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dtype(self) -> Any:
        return self.local.dtype

    def gather(self) -> Any:
        """The full array, on every rank (an all-gather over ``comm``)."""
        lengths = [stop - start for start, stop in self.ranges]
        return gather_along(self.local, self.comm, self.axis, lengths)

    def __repr__(self) -> str:
        return (
            f"ShardedArray(shape={self.shape}, axis={self.axis}, range={self.range}, "
            f"rank={self.comm.rank}/{self.comm.size}, dtype={self.dtype})"
        )

    # -- checkpoint state (ddp.checkpoint)

    def state_dict(self) -> dict[str, Any]:
        """This rank's block as a Shard of the global array (under the name it is given).

        Example: ``checkpoint.save("ckpt", {"x": sharded}, comm, step=0)`` saves ``x``.
        """
        offsets = [0] * self.ndim
        offsets[self.axis] = self.range[0]
        return {"": Shard(self.local, self.shape, tuple(offsets))}
