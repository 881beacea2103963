"""``DeviceMesh``: named axes over the ranks of a communicator, row-major.

The rank-grid math is pure (no communicator) so it can be tested and reasoned about alone.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .._core.communicator import Communicator
from .._errors import CommunicatorStateError, InvalidArgumentError


def mesh_coords(rank: int, shape: Mapping[str, int]) -> dict[str, int]:
    """Coordinates of ``rank`` in a row-major grid (the last name varies fastest).

    Example:
        >>> mesh_coords(5, {"pp": 2, "dp": 2, "tp": 2})
        {'pp': 1, 'dp': 0, 'tp': 1}
    """
    coords = {}
    for name in reversed(list(shape)):
        rank, coords[name] = divmod(rank, shape[name])
    return {name: coords[name] for name in shape}


def mesh_rank(coords: Mapping[str, int], shape: Mapping[str, int]) -> int:
    """Inverse of :func:`mesh_coords`: ``mesh_rank({"pp": 1, "dp": 0, "tp": 1}, shape) == 5``."""
    rank = 0
    for name, extent in shape.items():
        rank = rank * extent + coords[name]
    return rank


def group_color(rank: int, shape: Mapping[str, int], names: tuple[str, ...]) -> int:
    """Ranks with equal color differ only along ``names``: the color of the other coordinates.

    Example (pp=2, dp=2, tp=2): ranks 4 and 5 share ``group_color(., shape, ("tp",)) == 2``.
    """
    coords = mesh_coords(rank, shape)
    color = 0
    for name, extent in shape.items():
        if name not in names:
            color = color * extent + coords[name]
    return color


def group_members(rank: int, shape: Mapping[str, int], names: tuple[str, ...]) -> list[int]:
    """The ranks in ``rank``'s group along ``names``, in rank order.

    Example: ``group_members(5, {"pp": 2, "dp": 2, "tp": 2}, ("dp",)) == [5, 7]``.
    """
    color = group_color(rank, shape, names)
    size = math.prod(shape.values())
    return [r for r in range(size) if group_color(r, shape, names) == color]


class DeviceMesh:
    """Named mesh dimensions over a communicator's ranks (row-major, last name fastest).

    Building it is collective (every rank must do it): it splits one communicator per name.
    It owns those communicators: ``close()``, or the end of a ``with`` block, closes them (not
    ``comm``).

    Example:
        >>> shape = {"pp": 1, "dp": comm.size, "tp": 1}   # on 8 ranks: {"pp": 2, "dp": 2, "tp": 2}
        >>> with col.DeviceMesh(comm, shape) as mesh:
        ...     partial = mesh["tp"].all_reduce(x)   # over the ranks differing only along tp
        ...     mesh.coord                           # on rank 5 of 8: {'pp': 1, 'dp': 0, 'tp': 1}
        {'pp': 0, 'dp': 0, 'tp': 0}
    """

    def __init__(self, comm: Communicator, shape: Mapping[str, int]):
        shape = dict(shape)
        if not shape:
            raise InvalidArgumentError("DeviceMesh: shape must name at least one dimension, got {}")
        for name, extent in shape.items():
            if not isinstance(name, str) or type(extent) is not int or extent < 1:
                raise InvalidArgumentError(
                    f"DeviceMesh: dimension {name!r} must be a str with a positive int size, got {extent!r}"
                )
        if math.prod(shape.values()) != comm.size:
            raise InvalidArgumentError(
                f"DeviceMesh: sizes {shape} multiply to {math.prod(shape.values())}, "
                f"expected comm.size = {comm.size}"
            )
        self.comm = comm
        self.shape = shape
        self.names = tuple(shape)
        self.coord = mesh_coords(comm.rank, shape)
        self._groups: dict[tuple[str, ...], Communicator] = {}
        self.closed = False
        for name in self.names:
            self.group(name)

    def __getitem__(self, name: str) -> Communicator:
        return self.group(name)

    def group(self, *names: str) -> Communicator:
        """The communicator spanning ``names`` (collective the first time it is asked for)."""
        key = tuple(n for n in self.names if n in names)
        unknown = [n for n in names if n not in self.shape]
        if unknown or not names:
            raise InvalidArgumentError(
                f"DeviceMesh.group: names must be among {self.names}, got {names}"
            )
        if self.closed:
            raise CommunicatorStateError("DeviceMesh.group: the mesh is closed")
        if key not in self._groups:
            color = group_color(self.comm.rank, self.shape, key)
            sub = self.comm.split(color, key=self.comm.rank)
            assert sub is not None
            self._groups[key] = sub
        return self._groups[key]

    def close(self) -> None:
        """Close the sub-communicators it made (not the parent). Idempotent."""
        self.closed = True
        for sub in self._groups.values():
            sub.close()
        self._groups.clear()

    def __enter__(self) -> DeviceMesh:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DeviceMesh({self.shape}, coord={self.coord})"
