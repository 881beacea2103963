"""Rank-grid math of ``col.DeviceMesh``, in-process: each rank's mesh is built on a stand-in
communicator that records the split each group asks for (no MPI call is made)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

import collectives as col

SHAPES = [
    {"a": 1},
    {"a": 4},
    {"a": 2, "b": 2},
    {"pp": 2, "dp": 2, "tp": 2},
    {"x": 3, "y": 1, "z": 2},
    {"pp": 2, "dp": 3, "tp": 4},
]


class Part:
    """What a split returns: the color and key it was asked for."""

    def __init__(self, color: int, key: int):
        self.color, self.key = color, key
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Rank:
    """One rank of ``size``, as ``DeviceMesh`` sees a communicator: its rank, its size, and
    ``split(color, key)``, recorded."""

    def __init__(self, rank: int, size: int):
        self.rank, self.size = rank, size
        self.splits: list[Part] = []

    def split(self, color: int, key: int | None = None) -> Part:
        part = Part(color, self.rank if key is None else key)
        self.splits.append(part)
        return part


def _grid(shape):
    """NumPy's row-major reference: grid[coords] == rank."""
    return np.arange(math.prod(shape.values())).reshape(tuple(shape.values()))


def _meshes(shape) -> list[col.DeviceMesh]:
    """Every rank's mesh of ``shape``."""
    size = math.prod(shape.values())
    return [col.DeviceMesh(Rank(r, size), shape) for r in range(size)]


def _members(meshes, names) -> list[list[int]]:
    """For each rank, the ranks of its group along ``names``: those whose split had the same
    color, in the order of their keys (as MPI orders a split's ranks)."""
    parts = [mesh.group(*names) for mesh in meshes]
    groups = []
    for mine in parts:
        same = [(p.key, r) for r, p in enumerate(parts) if p.color == mine.color]
        groups.append([r for _, r in sorted(same)])
    return groups


def test_docstring_example():
    shape = {"pp": 2, "dp": 2, "tp": 2}
    meshes = _meshes(shape)
    assert meshes[5].coord == {"pp": 1, "dp": 0, "tp": 1}
    assert list(meshes[5].coord) == ["pp", "dp", "tp"]
    assert meshes[4]["tp"].color == meshes[5]["tp"].color
    assert _members(meshes, ("dp",))[5] == [5, 7]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_coords_match_numpy_row_major(shape):
    grid = _grid(shape)
    meshes = _meshes(shape)
    for index in itertools.product(*(range(n) for n in shape.values())):
        rank = int(grid[index])
        assert meshes[rank].coord == dict(zip(shape, index))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_groups_are_the_ranks_differing_only_along_names(shape):
    names = list(shape)
    size = math.prod(shape.values())
    meshes = _meshes(shape)
    for count in range(1, len(names) + 1):
        for chosen in itertools.combinations(names, count):
            members = _members(meshes, chosen)
            for rank in range(size):
                mine = meshes[rank].coord
                expected = [
                    r
                    for r in range(size)
                    if all(meshes[r].coord[n] == mine[n] for n in names if n not in chosen)
                ]
                assert members[rank] == expected
                assert rank in members[rank]
                assert len(members[rank]) == math.prod(shape[n] for n in chosen)
            # the groups partition the ranks, one color each (0..k-1, as split colors go)
            colors = {meshes[r].group(*chosen).color for r in range(size)}
            assert sorted(colors) == list(range(size // math.prod(shape[n] for n in chosen)))
            groups = {tuple(m) for m in members}
            assert sorted(r for g in groups for r in g) == list(range(size))


def test_a_group_over_every_name_is_the_world():
    shape = {"pp": 2, "dp": 3, "tp": 4}
    meshes = _meshes(shape)
    assert _members(meshes, ("pp", "dp", "tp")) == [list(range(24))] * 24
    assert {m.group("pp", "dp", "tp").color for m in meshes} == {0}


def test_two_by_two_rows_and_columns():
    meshes = _meshes({"a": 2, "b": 2})
    assert _members(meshes, ("a",)) == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert _members(meshes, ("b",)) == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [m.coord for m in meshes] == [
        {"a": 0, "b": 0},
        {"a": 0, "b": 1},
        {"a": 1, "b": 0},
        {"a": 1, "b": 1},
    ]


def test_a_mesh_splits_once_per_name_and_group_and_closes_what_it_made():
    rank = Rank(5, 8)
    mesh = col.DeviceMesh(rank, {"pp": 2, "dp": 2, "tp": 2})
    assert len(rank.splits) == 3  # one per name, as it is built
    assert mesh.group("tp", "dp") is mesh.group("dp", "tp")  # one communicator per set
    assert len(rank.splits) == 4
    mesh.close()
    assert all(part.closed for part in rank.splits)
    with pytest.raises(col.CommunicatorStateError, match="closed"):
        mesh.group("tp")
