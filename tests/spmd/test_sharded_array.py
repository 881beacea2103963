"""ShardedArray: round trips with even and uneven splits, on any axis."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import InvalidArgumentError
from ddp.sharded import ShardedArray

SHARED_COMM = True  # COLLECTIVES_TEST_REUSE_COMM=1 may give every test one communicator

WORLD_SIZES = (1, 2, 4)


def host(a):
    return a.get() if hasattr(a, "get") else a


@pytest.mark.parametrize(
    "shape,axis",
    [((8, 3), 0), ((9, 3), 0), ((3, 5), 1), ((3, 2, 7), -1), ((3, 4), 0)],
    ids=["even", "uneven", "axis1", "last-axis", "fewer-rows-than-ranks-at-4"],
)
def test_shard_gather_round_trip(comm, xp, shape, axis):
    x = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    s = ShardedArray.shard(xp.asarray(x), comm, axis=axis)
    expected = np.array_split(x, comm.size, axis=axis)[comm.rank]
    assert s.shape == shape and s.axis == axis % len(shape)
    start = sum(p.shape[axis] for p in np.array_split(x, comm.size, axis=axis)[: comm.rank])
    assert s.range == (start, start + expected.shape[axis])
    np.testing.assert_array_equal(host(s.local), expected)
    np.testing.assert_array_equal(host(s.gather()), x)


def test_ranges_follow_array_split(comm, xp):
    s = ShardedArray.shard(xp.zeros(10), comm)
    bounds = np.cumsum([0] + [len(p) for p in np.array_split(np.zeros(10), comm.size)])
    assert s.ranges == [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]


def test_from_local_assembles_blocks(comm, xp):
    rows = 2 if comm.rank < 1 else 1  # rank 0 holds the extra row, as array_split does
    local = np.full((rows, 3), float(comm.rank))
    s = ShardedArray.from_local(xp.asarray(local), comm, axis=0)
    assert s.shape == (comm.size + 1, 3)
    expected = np.concatenate([np.full((2 if r < 1 else 1, 3), float(r)) for r in range(comm.size)])
    np.testing.assert_array_equal(host(s.gather()), expected)


def test_sharded_array_errors(comm, xp):
    with pytest.raises(InvalidArgumentError, match=r"axis must be in \[-2, 2\), got 2"):
        ShardedArray.shard(xp.zeros((2, 2)), comm, axis=2)
    with pytest.raises(InvalidArgumentError, match=r"local has shape \(5,\), expected"):
        ShardedArray(xp.zeros(5), comm, 0, (4 * comm.size,))
    if comm.size > 1:
        rows = 2 if comm.rank == comm.size - 1 else 1  # the extra row on the wrong rank
        with pytest.raises(InvalidArgumentError, match="numpy.array_split order"):
            ShardedArray.from_local(xp.zeros((rows, 2)), comm)
        cols = 3 if comm.rank == 0 else 2
        with pytest.raises(InvalidArgumentError, match="blocks differ outside axis 0"):
            ShardedArray.from_local(xp.zeros((1, cols)), comm)
