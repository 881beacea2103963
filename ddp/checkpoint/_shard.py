"""A state made of global names: what each rank holds of which global tensor.

A state is a mapping ``name -> value`` where a value is an array (the whole tensor, the
same on every rank that gives it), a :class:`Shard` (a block of a larger tensor), a list of
Shards (several blocks of one tensor held by this rank), a JSON value (step, data position,
RNG state), a nested mapping, or a *stateful* object: anything with ``state_dict()``
(returning such a mapping) and, optionally, ``load_state_dict(loaded)``, called after a
load with the same mapping where JSON values hold what was loaded. Nested names join
with ``.``: ``{"optim": zero}`` gives ``optim.exp_avg.h0.w_qkv``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from collectives import InvalidArgumentError

__all__ = ["Shard", "flat_range_blocks", "flatten_state", "Flat"]


@dataclass
class Shard:
    """Block ``local`` of a global tensor of ``global_shape``, starting at ``offsets``.

    ``local`` is read on save and written in place on load, so give the live array (or a
    view of it). Example: rank 1 of 2 holding columns 3..6 of a ``(4, 6)`` weight gives
    ``Shard(w_local, (4, 6), (0, 3))``.
    """

    local: Any
    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]

    def __post_init__(self) -> None:
        self.global_shape = tuple(int(n) for n in self.global_shape)
        self.offsets = tuple(int(n) for n in self.offsets)
        shape = tuple(int(n) for n in self.local.shape)
        if len(shape) != len(self.global_shape) or len(self.offsets) != len(shape):
            raise InvalidArgumentError(
                f"Shard: local shape {shape}, global_shape {self.global_shape} and offsets "
                f"{self.offsets} must have the same length"
            )
        for o, n, g in zip(self.offsets, shape, self.global_shape):
            if o < 0 or o + n > g:
                raise InvalidArgumentError(
                    f"Shard: a block of shape {shape} at offsets {self.offsets} does not fit "
                    f"in the global shape {self.global_shape}"
                )

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(n) for n in self.local.shape)


def flat_range_blocks(
    shape: Sequence[int], start: int, stop: int
) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """Split the C-order range ``[start, stop)`` of an array of ``shape`` into rectangular blocks.

    Returns ``(offsets, block_shape)`` pairs in order; a contiguous flat range is a head of a
    row, whole rows, and a tail of a row, recursively. This maps a ZeRO flat shard back to
    blocks of each parameter. Example: ``flat_range_blocks((3, 4), 2, 9)`` is
    ``[((0, 2), (1, 2)), ((1, 0), (1, 4)), ((2, 0), (1, 1))]``.
    """
    shape = tuple(int(n) for n in shape)
    if not shape:
        return [((), ())] if start < stop else []
    if start >= stop:
        return []
    row = math.prod(shape[1:])
    if row == 0:
        return []
    first, last = start // row, (stop - 1) // row
    if len(shape) == 1:
        return [((start,), (stop - start,))]
    if first == last:
        inner = flat_range_blocks(shape[1:], start - first * row, stop - first * row)
        return [((first, *o), (1, *s)) for o, s in inner]
    blocks = []
    whole_from = first
    if start % row:
        inner = flat_range_blocks(shape[1:], start % row, row)
        blocks += [((first, *o), (1, *s)) for o, s in inner]
        whole_from = first + 1
    whole_to = stop // row
    if whole_to > whole_from:
        blocks.append(
            ((whole_from,) + (0,) * (len(shape) - 1), (whole_to - whole_from, *shape[1:]))
        )
    if stop % row:
        inner = flat_range_blocks(shape[1:], 0, stop % row)
        blocks += [((whole_to, *o), (1, *s)) for o, s in inner]
    return blocks


def _is_array(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype") and not isinstance(value, Shard)


def _is_json(value: Any) -> bool:
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple)):
        return all(_is_json(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _is_json(v) for k, v in value.items())
    return False


@dataclass
class Flat:
    """A state flattened to global names: tensors (as shards), JSON values, and the
    stateful objects to call back after a load, each with its prefix and flat mapping."""

    tensors: dict[str, list[Shard]]
    values: dict[str, Any]
    callbacks: list[tuple[Any, str, dict[str, Any]]]


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix and key else prefix or key


def flatten_state(state: Mapping[str, Any], call: str) -> Flat:
    """Flatten a state (see the module docstring) to global names; bad values raise here.

    Example: ``flatten_state({"w": w, "step": 3}, "save").tensors["w"][0].offsets == (0, 0)``.
    """
    flat = Flat({}, {}, [])
    _flatten(state, "", flat, call)
    return flat


def _flatten(state: Mapping[str, Any], prefix: str, flat: Flat, call: str) -> None:
    for key, value in state.items():
        if not isinstance(key, str):
            raise InvalidArgumentError(f"{call}: state names must be strings, got {key!r}")
        name = _join(prefix, key)
        if hasattr(value, "state_dict") and callable(value.state_dict):
            inner = value.state_dict()
            flat.callbacks.append((value, name, inner))
            _flatten(inner, name, flat, call)
        elif isinstance(value, Shard):
            _add_tensor(flat, name, [value], call)
        elif isinstance(value, list) and value and all(isinstance(v, Shard) for v in value):
            _add_tensor(flat, name, list(value), call)
        elif _is_array(value):
            shape = tuple(int(n) for n in value.shape)
            _add_tensor(flat, name, [Shard(value, shape, (0,) * len(shape))], call)
        elif isinstance(value, Mapping) and not _is_json(value):
            _flatten(value, name, flat, call)
        elif _is_json(value):
            if name in flat.tensors or name in flat.values:
                raise InvalidArgumentError(f"{call}: the name {name!r} is given twice")
            flat.values[name] = value
        else:
            raise InvalidArgumentError(
                f"{call}: state[{name!r}] is a {type(value).__name__}, expected an array, a "
                "Shard, a list of Shards, a JSON value, a mapping or an object with state_dict()"
            )


def _add_tensor(flat: Flat, name: str, shards: list[Shard], call: str) -> None:
    if name in flat.tensors or name in flat.values:
        raise InvalidArgumentError(f"{call}: the name {name!r} is given twice")
    shapes = {s.global_shape for s in shards}
    dtypes = {str(s.local.dtype) for s in shards}
    if len(shapes) != 1 or len(dtypes) != 1:
        raise InvalidArgumentError(
            f"{call}: the shards of {name!r} disagree on global shape or dtype: "
            f"{sorted(shapes)}, {sorted(dtypes)}"
        )
    flat.tensors[name] = shards


def intersect(
    a_offsets: Sequence[int],
    a_shape: Sequence[int],
    b_offsets: Sequence[int],
    b_shape: Sequence[int],
) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
    """Where block a and block b overlap, as slices into a and into b (None: they do not).

    Example: ``intersect((0,), (4,), (2,), (4,)) == ((slice(2, 4),), (slice(0, 2),))``.
    """
    into_a, into_b = [], []
    for ao, an, bo, bn in zip(a_offsets, a_shape, b_offsets, b_shape):
        lo, hi = max(ao, bo), min(ao + an, bo + bn)
        if lo >= hi:
            return None
        into_a.append(slice(lo - ao, hi - ao))
        into_b.append(slice(lo - bo, hi - bo))
    return tuple(into_a), tuple(into_b)


Placement = tuple[tuple[int, ...], tuple[int, ...]]  # (global_shape, offsets) of a local array


def placed(local: Any, name: str, placements: Mapping[str, Placement] | None) -> Any:
    """``local`` as a Shard of its global tensor when ``placements`` names it, else itself.

    Example: ``placed(w, "w_qkv", {"w_qkv": ((8, 24), (0, 12))})`` is a Shard at column 12.
    """
    if placements is None or name not in placements:
        return local
    global_shape, offsets = placements[name]
    return Shard(local, global_shape, offsets)


def flat_space_shards(
    flat: Any,
    start: int,
    layout: Mapping[str, tuple[int, int]],
    shapes: Mapping[str, tuple[int, ...]],
    placements: Mapping[str, Placement] | None = None,
) -> dict[str, list[Shard]]:
    """The blocks of each named array that ``flat`` holds, ``flat`` being the range
    ``[start, start + len(flat))`` of a flat space where ``name`` sits at ``layout[name]``.

    Each block is a view into ``flat`` (so a load fills ``flat`` in place), placed in its
    global tensor by ``placements`` (tensor parallel: this rank's array is itself a block).
    Example: a ZeRO shard ``[4, 10)`` over ``w`` at ``(0, 6)`` (shape ``(2, 3)``) and ``b`` at
    ``(6, 9)`` gives ``w``'s elements 4..5 and all of ``b``.
    """
    stop = start + int(flat.shape[0])
    out: dict[str, list[Shard]] = {}
    for name, (a, b) in layout.items():
        lo, hi = max(a, start), min(b, stop)
        if lo >= hi:
            continue
        shape = tuple(shapes[name])
        global_shape, base = shape, (0,) * len(shape)
        if placements is not None and name in placements:
            global_shape, base = placements[name]
        shards = []
        for offsets, block in flat_range_blocks(shape, lo - a, hi - a):
            first = a + (int(_ravel(offsets, shape)) if shape else 0) - start
            view = flat[first : first + math.prod(block)].reshape(block)
            shards.append(Shard(view, global_shape, tuple(o + p for o, p in zip(offsets, base))))
        out[name] = shards
    return out


def _ravel(offsets: tuple[int, ...], shape: tuple[int, ...]) -> int:
    index = 0
    for o, n in zip(offsets, shape):
        index = index * n + o
    return index
