"""Rank-grid math behind ``col.DeviceMesh`` (pure functions, no communicator)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from collectives._mesh import group_color, group_members, mesh_coords, mesh_rank

SHAPES = [
    {"a": 1},
    {"a": 4},
    {"a": 2, "b": 2},
    {"pp": 2, "dp": 2, "tp": 2},
    {"x": 3, "y": 1, "z": 2},
    {"pp": 2, "dp": 3, "tp": 4},
]


def _grid(shape):
    """NumPy's row-major reference: grid[coords] == rank."""
    return np.arange(math.prod(shape.values())).reshape(tuple(shape.values()))


def test_docstring_examples():
    shape = {"pp": 2, "dp": 2, "tp": 2}
    assert mesh_coords(5, shape) == {"pp": 1, "dp": 0, "tp": 1}
    assert list(mesh_coords(5, shape)) == ["pp", "dp", "tp"]
    assert mesh_rank({"pp": 1, "dp": 0, "tp": 1}, shape) == 5
    assert group_color(4, shape, ("tp",)) == group_color(5, shape, ("tp",)) == 2
    assert group_members(5, shape, ("dp",)) == [5, 7]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_coords_match_numpy_row_major(shape):
    grid = _grid(shape)
    for index in itertools.product(*(range(n) for n in shape.values())):
        rank = int(grid[index])
        coords = dict(zip(shape, index))
        assert mesh_coords(rank, shape) == coords
        assert mesh_rank(coords, shape) == rank


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_group_members_are_the_ranks_differing_only_along_names(shape):
    names = list(shape)
    grid = _grid(shape)
    size = grid.size
    for count in range(1, len(names) + 1):
        for chosen in itertools.combinations(names, count):
            groups = {}
            for rank in range(size):
                members = group_members(rank, shape, chosen)
                mine = mesh_coords(rank, shape)
                expected = [
                    r
                    for r in range(size)
                    if all(mesh_coords(r, shape)[n] == mine[n] for n in names if n not in chosen)
                ]
                assert members == expected
                assert rank in members
                assert len(members) == math.prod(shape[n] for n in chosen)
                groups.setdefault(group_color(rank, shape, chosen), members)
                assert groups[group_color(rank, shape, chosen)] == members
            # Colors are 0..k-1 and the groups partition the ranks.
            assert sorted(groups) == list(range(size // math.prod(shape[n] for n in chosen)))
            assert sorted(r for m in groups.values() for r in m) == list(range(size))


def test_group_over_every_name_is_the_world():
    shape = {"pp": 2, "dp": 3, "tp": 4}
    for rank in range(24):
        assert group_members(rank, shape, ("pp", "dp", "tp")) == list(range(24))
        assert group_color(rank, shape, ("pp", "dp", "tp")) == 0


def test_two_by_two_rows_and_columns():
    shape = {"a": 2, "b": 2}
    assert [group_members(r, shape, ("a",)) for r in range(4)] == [[0, 2], [1, 3], [0, 2], [1, 3]]
    assert [group_members(r, shape, ("b",)) for r in range(4)] == [[0, 1], [0, 1], [2, 3], [2, 3]]
    assert [mesh_coords(r, shape) for r in range(4)] == [
        {"a": 0, "b": 0},
        {"a": 0, "b": 1},
        {"a": 1, "b": 0},
        {"a": 1, "b": 1},
    ]
