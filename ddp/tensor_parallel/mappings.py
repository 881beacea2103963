"""Region mappings: the communication of tensor and sequence parallelism, as conjugate pairs.

Each mapping is a namespace of two functions, ``forward(x, comm)`` and ``backward(dy, comm)``,
where ``backward`` is the adjoint (transpose) of ``forward``: for every ``x`` and ``y``,
``<forward(x), y> == <x, backward(y)>``. The inner products follow what a value is across
the group: a *replicated* value (the same on every rank) is counted once; a *sharded* value
(rank r holds block r) or a *partial* value (rank r holds one term of a sum) is summed over
ranks. That is the identity the tests check, and what makes a layer built from these maps
compute exactly the gradient of the unsharded layer.

Shards are contiguous blocks in rank order. A split that does not divide evenly is an error
unless ``pad=True``: blocks then follow ``numpy.array_split`` (the first ``length % size``
ranks hold one item more) and are zero-padded to one length for the collective, then trimmed;
a gather with ``pad=True`` first all-gathers the block lengths (one small extra collective).

Example (the Megatron MLP: column-parallel, then row-parallel)::

    h = copy_to_group.forward(x, tp) @ w1_shard        # backward all-reduces dx
    y = reduce_from_group.forward(h @ w2_shard, tp)     # forward all-reduces partial sums
"""

from __future__ import annotations

from typing import Any

from collectives import CommunicatorLike, InvalidArgumentError, array_module

from ..sharded import gather_along, shard_ranges

__all__ = [
    "copy_to_group",
    "reduce_from_group",
    "scatter_to_group",
    "gather_from_group",
    "scatter_to_sequence",
    "gather_from_sequence",
    "reduce_scatter_to_sequence",
    "MAPPINGS",
]


def _ranges(
    call: str, length: int, comm: CommunicatorLike, pad: bool, axis: int
) -> list[tuple[int, int]]:
    if not pad and length % comm.size:
        raise InvalidArgumentError(
            f"{call}: axis {axis} has length {length}, expected a multiple of the group size "
            f"{comm.size} (pass pad=True for uneven blocks)"
        )
    return shard_ranges(length, comm.size)


def _all_reduce(x: Any, comm: CommunicatorLike) -> Any:
    xp = array_module(x)
    out = xp.empty_like(x)
    comm.all_reduce(xp.ascontiguousarray(x), op="sum", out=out)
    return out


def _split(call: str, x: Any, comm: CommunicatorLike, axis: int, pad: bool) -> Any:
    xp = array_module(x)
    axis %= x.ndim
    start, stop = _ranges(call, x.shape[axis], comm, pad, axis)[comm.rank]
    index = [slice(None)] * x.ndim
    index[axis] = slice(start, stop)
    return xp.ascontiguousarray(x[tuple(index)])


def _gather(call: str, x: Any, comm: CommunicatorLike, axis: int, pad: bool) -> Any:
    axis %= x.ndim
    if not pad:
        return gather_along(x, comm, axis, [x.shape[axis]] * comm.size)
    xp = array_module(x)
    mine = xp.asarray([x.shape[axis]], dtype=xp.int64)
    lengths_out = xp.empty((comm.size, 1), dtype=xp.int64)
    comm.all_gather(mine, out=lengths_out)
    lengths = [row[0] for row in lengths_out.tolist()]
    expected = [b - a for a, b in shard_ranges(sum(lengths), comm.size)]
    if lengths != expected:
        raise InvalidArgumentError(
            f"{call}: block lengths along axis {axis} are {lengths}, expected {expected} "
            "(numpy.array_split order)"
        )
    return gather_along(x, comm, axis, lengths)


def _reduce_scatter(call: str, x: Any, comm: CommunicatorLike, axis: int, pad: bool) -> Any:
    xp = array_module(x)
    axis %= x.ndim
    ranges = _ranges(call, x.shape[axis], comm, pad, axis)
    moved = xp.moveaxis(x, axis, 0)
    longest = max(stop - start for start, stop in ranges)
    if longest * comm.size == moved.shape[0]:
        blocks = xp.ascontiguousarray(moved).reshape(comm.size, longest, *moved.shape[1:])
    else:
        blocks = xp.zeros((comm.size, longest, *moved.shape[1:]), dtype=x.dtype)
        for r, (start, stop) in enumerate(ranges):
            blocks[r, : stop - start] = moved[start:stop]
    out = xp.empty(blocks.shape[1:], dtype=x.dtype)
    comm.reduce_scatter(blocks, op="sum", out=out)
    start, stop = ranges[comm.rank]
    return xp.ascontiguousarray(xp.moveaxis(out[: stop - start], 0, axis))


class copy_to_group:
    """forward: identity (replicated in, partial out); backward: all-reduce (sum) over the group."""

    @staticmethod
    def forward(x: Any, comm: CommunicatorLike, *, pad: bool = False) -> Any:
        return x

    @staticmethod
    def backward(dy: Any, comm: CommunicatorLike, *, pad: bool = False) -> Any:
        return _all_reduce(dy, comm)


class reduce_from_group:
    """forward: all-reduce (sum) over the group (partial in, replicated out); backward: identity."""

    @staticmethod
    def forward(x: Any, comm: CommunicatorLike, *, pad: bool = False) -> Any:
        return _all_reduce(x, comm)

    @staticmethod
    def backward(dy: Any, comm: CommunicatorLike, *, pad: bool = False) -> Any:
        return dy


class scatter_to_group:
    """forward: keep this rank's block of the last axis; backward: all-gather along the last axis."""

    @staticmethod
    def forward(x: Any, comm: CommunicatorLike, *, pad: bool = False) -> Any:
        return _split("scatter_to_group.forward", x, comm, -1, pad)

    @staticmethod
    def backward(dy: Any, comm: CommunicatorLike, *, pad: bool = False) -> Any:
        return _gather("scatter_to_group.backward", dy, comm, -1, pad)


class gather_from_group:
    """forward: all-gather along the last axis; backward: keep this rank's block of the last axis."""

    @staticmethod
    def forward(x: Any, comm: CommunicatorLike, *, pad: bool = False) -> Any:
        return _gather("gather_from_group.forward", x, comm, -1, pad)

    @staticmethod
    def backward(dy: Any, comm: CommunicatorLike, *, pad: bool = False) -> Any:
        return _split("gather_from_group.backward", dy, comm, -1, pad)


class scatter_to_sequence:
    """forward: keep this rank's block of the first axis; backward: all-gather along the first axis."""

    @staticmethod
    def forward(x: Any, comm: CommunicatorLike, *, pad: bool = False) -> Any:
        return _split("scatter_to_sequence.forward", x, comm, 0, pad)

    @staticmethod
    def backward(dy: Any, comm: CommunicatorLike, *, pad: bool = False) -> Any:
        return _gather("scatter_to_sequence.backward", dy, comm, 0, pad)


class gather_from_sequence:
    """forward: all-gather along the first axis (partial out); backward: reduce-scatter along it."""

    @staticmethod
    def forward(x: Any, comm: CommunicatorLike, *, pad: bool = False) -> Any:
        return _gather("gather_from_sequence.forward", x, comm, 0, pad)

    @staticmethod
    def backward(dy: Any, comm: CommunicatorLike, *, pad: bool = False) -> Any:
        return _reduce_scatter("gather_from_sequence.backward", dy, comm, 0, pad)


class reduce_scatter_to_sequence:
    """forward: reduce-scatter (sum) along the first axis; backward: all-gather along it."""

    @staticmethod
    def forward(x: Any, comm: CommunicatorLike, *, pad: bool = False) -> Any:
        return _reduce_scatter("reduce_scatter_to_sequence.forward", x, comm, 0, pad)

    @staticmethod
    def backward(dy: Any, comm: CommunicatorLike, *, pad: bool = False) -> Any:
        return _gather("reduce_scatter_to_sequence.backward", dy, comm, 0, pad)


#: Every mapping with the kind of value it takes and gives ("replicated", "partial" or
#: "sharded" along an axis): what the adjoint test needs to pick its inner products.
MAPPINGS = {
    copy_to_group: ("replicated", "partial"),
    reduce_from_group: ("partial", "replicated"),
    scatter_to_group: ("replicated", "sharded"),
    gather_from_group: ("sharded", "replicated"),
    scatter_to_sequence: ("replicated", "sharded"),
    gather_from_sequence: ("sharded", "partial"),
    reduce_scatter_to_sequence: ("partial", "sharded"),
}
