"""LoadBalancer arithmetic, fed every rank's numbers directly (no communicator)."""

from __future__ import annotations

import pytest

from collectives import InvalidArgumentError
from ddp.load_balance import LoadBalancer, floored_fractions, split_batch


def test_split_batch_sums_and_rounds():
    assert split_batch([0.5, 0.25, 0.25], 10) == [5, 3, 2]
    assert split_batch([1, 1, 1], 10) == [4, 3, 3]
    assert split_batch([1, 2], 7) == [2, 5]
    for total in range(3, 50):
        assert sum(split_batch([0.3, 0.3, 0.4], total)) == total


def test_floor_pins_slow_ranks():
    assert floored_fractions([98.0, 1.0, 1.0], 0.05) == pytest.approx([0.9, 0.05, 0.05])
    # pinning one rank can push another under the floor: repeated until none is
    f = floored_fractions([100.0, 5.2, 0.1], 0.05)
    assert f == pytest.approx([0.9, 0.05, 0.05])
    assert floored_fractions([3.0, 1.0], 0.05) == pytest.approx([0.75, 0.25])


def test_equal_start_and_proportional_shares():
    lb = LoadBalancer(None, 100, size=2, smoothing=1.0)
    assert lb.shares == [50, 50]
    # rank 1 twice as fast: 50 samples in 1 s vs 50 samples in 0.5 s
    assert lb.observe([1.0, 0.5], [50, 50]) == [33, 67]
    assert sum(lb.shares) == 100


def test_exponential_average():
    lb = LoadBalancer(None, 90, size=3, smoothing=0.5)
    lb.observe([1.0, 1.0, 1.0], [30, 30, 30])  # 30, 30, 30 samples/s
    assert lb.throughput == [30.0, 30.0, 30.0]
    lb.observe([1.0, 1.0, 0.5], [30, 30, 30])  # rank 2 now 60/s -> average 45
    assert lb.throughput == [30.0, 30.0, 45.0]
    assert lb.shares == [26, 26, 38]
    assert lb.weight == pytest.approx(26 / 90)  # rank 0's weight


def test_floor_applies():
    lb = LoadBalancer(None, 200, size=2, smoothing=1.0, floor=0.1)
    assert lb.observe([1.0, 1.0], [1000, 1]) == [180, 20]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"global_batch": 1, "size": 2}, "global_batch must be an integer >= size"),
        ({"global_batch": 8, "size": 2, "smoothing": 0.0}, "smoothing must be in"),
        ({"global_batch": 8, "size": 4, "floor": 0.3}, "floor must be in"),
        ({"global_batch": 8}, "size is required"),
    ],
)
def test_bad_arguments(kwargs, message):
    with pytest.raises(InvalidArgumentError, match=message):
        LoadBalancer(None, **kwargs)


def test_bad_observations():
    lb = LoadBalancer(None, 8, size=2)
    with pytest.raises(InvalidArgumentError, match="expected 2 step times"):
        lb.observe([1.0], [4])
    with pytest.raises(InvalidArgumentError, match="step times must be > 0"):
        lb.observe([1.0, 0.0], [4, 4])
    with pytest.raises(InvalidArgumentError, match="needs a communicator"):
        lb.record(1.0, 4)
