"""Shard range math shared by ShardedArray and the tensor-parallel mappings (no communicator)."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import InvalidArgumentError
from ddp.sharded import even_shard_size, shard_ranges


@pytest.mark.parametrize("length,size", [(10, 4), (8, 4), (3, 4), (0, 2), (7, 1)])
def test_shard_ranges_follow_array_split(length, size):
    pieces = np.array_split(np.arange(length), size)
    expected = [(int(p[0]), int(p[-1]) + 1) if len(p) else None for p in pieces]
    ranges = shard_ranges(length, size)
    assert len(ranges) == size
    assert all(e is None or r == e for r, e in zip(ranges, expected))
    assert [b - a for a, b in ranges] == [len(p) for p in pieces]
    assert ranges[0][0] == 0 and ranges[-1][1] == length


def test_shard_ranges_worked_example():
    assert shard_ranges(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]


def test_even_shard_size():
    assert even_shard_size("Layer", "out_features", 12, 4) == 3
    with pytest.raises(
        InvalidArgumentError,
        match="Layer: out_features is 10, expected a multiple of the group size 4",
    ):
        even_shard_size("Layer", "out_features", 10, 4)


def test_shard_ranges_errors():
    with pytest.raises(InvalidArgumentError, match="size must be >= 1, got 0"):
        shard_ranges(4, 0)
    with pytest.raises(InvalidArgumentError, match="length must be >= 0, got -1"):
        shard_ranges(-1, 2)
