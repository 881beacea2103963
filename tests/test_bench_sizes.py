"""Size parsing and the size sweep of benchmarks.collective (in-process)."""

from __future__ import annotations

import pytest

from benchmarks._sizes import parse_size, size_sweep
from collectives import InvalidArgumentError


@pytest.mark.parametrize(
    "text,expected",
    [("8", 8), ("0", 0), ("128K", 131072), ("128k", 131072), ("128M", 128 << 20),
     ("1G", 1 << 30), ("2KB", 2048), ("3MiB", 3 << 20), (" 64 ", 64), (4096, 4096)],
)  # fmt: skip
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "1.5M", "-8", "12X", "8 M B", "1e6"])
def test_parse_size_rejects(text):
    with pytest.raises(InvalidArgumentError, match=r"parse_size: size must be a byte count"):
        parse_size(text)


def test_sweep_by_factor():
    assert size_sweep(8, 128 << 20, factor=2) == [8 << k for k in range(25)]
    assert size_sweep(8, 100, factor=4) == [8, 32]
    assert size_sweep(8, 64) == [8, 16, 32, 64]  # factor 2 by default
    assert size_sweep(1 << 20, 1 << 20, factor=2) == [1 << 20]


def test_sweep_by_step():
    assert size_sweep(1024, 4000, step=1024) == [1024, 2048, 3072]
    assert size_sweep(5, 5, step=1) == [5]


def test_factor_above_one_wins_over_step_as_in_nccl_tests():
    assert size_sweep(8, 64, factor=2, step=8) == [8, 16, 32, 64]
    assert size_sweep(8, 24, factor=1, step=8) == [8, 16, 24]
    assert size_sweep(1 << 20, 3 << 20, factor=1) == [1 << 20, 2 << 20, 3 << 20]


@pytest.mark.parametrize(
    "args,message",
    [((0, 8), r"min_bytes \(-b\) must be >= 1, got 0"),
     ((16, 8), r"max_bytes \(-e\) must be >= min_bytes \(-b\) = 16, got 8"),
     ((8, 64, 0), r"step factor \(-f\) must be >= 1, got 0"),
     ((8, 64, None, 0), r"step bytes \(-i\) must be >= 1, got 0")],
)  # fmt: skip
def test_sweep_rejects(args, message):
    with pytest.raises(InvalidArgumentError, match=message):
        size_sweep(*args)
