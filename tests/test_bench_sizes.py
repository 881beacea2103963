"""Size parsing and the size sweep of benchmarks.collective (in-process)."""

from __future__ import annotations

import ctypes
import ctypes.util

import pytest

from benchmarks._sizes import c_integer, parse_size, size_sweep
from collectives import InvalidArgumentError


@pytest.mark.parametrize(
    "text,expected",
    [("8", 8), ("0", 0), ("128K", 131072), ("128k", 131072), ("128M", 128 << 20),
     ("1G", 1 << 30), ("2KB", 2048), ("3MiB", 3 << 20), (" 64 ", 64), (4096, 4096),
     ("1.5M", 3 << 19), ("1e3", 1000), ("0x8", 8), ("8 M B", 8 << 20), ("0.5k", 512),
     ("1.7", 1), ("2T", 2 << 40), ("8B", 8)],
)  # fmt: skip
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "K", "-8", "12X", "x8", "-0x8"])
def test_parse_size_rejects(text):
    with pytest.raises(InvalidArgumentError, match=r"parse_size: size must be a byte count"):
        parse_size(text)


# nccl-tests' parsesize, with the C library's own sscanf: the reference for parse_size
_LIBC = ctypes.CDLL(ctypes.util.find_library("c"))


def _nccl_tests_parsesize(text: str) -> float:
    size, lit = ctypes.c_double(), ctypes.create_string_buffer(8)
    count = _LIBC.sscanf(text.encode(), b"%lf %1s", ctypes.byref(size), lit)
    units = {b"G": 1 << 30, b"g": 1 << 30, b"M": 1 << 20, b"m": 1 << 20, b"K": 1 << 10,
             b"k": 1 << 10}  # fmt: skip
    if count == 2:
        return size.value * units[lit.value] if lit.value in units else -1.0
    return size.value if count == 1 else -1.0


@pytest.mark.parametrize(
    "text", ["8", "128K", "1.5M", "1e3", "0x8", "0x1p4", "8 M B", "0.5k", "1.7", " 64 ",
             "2KB", "3MiB", "1G", "", "K", "-8", "12X", "1e", "x8"],
)  # fmt: skip
def test_parse_size_reads_what_nccl_tests_reads(text):
    want = _nccl_tests_parsesize(text)
    if want < 0:
        with pytest.raises(InvalidArgumentError):
            parse_size(text)
    else:
        assert parse_size(text) == int(want)


@pytest.mark.parametrize("text", ["20", "0x10", "0X1f", "010", "0", "-1", " 7", "+3"])
def test_integers_as_strtol_base_0(text):
    strtol = _LIBC.strtol
    strtol.restype = ctypes.c_long
    assert c_integer(text) == strtol(text.encode(), None, 0)


@pytest.mark.parametrize("text", ["", "abc", "20abc", "08", "1.5", "0x"])
def test_integers_refuse_what_strtol_would_half_read(text):
    with pytest.raises(InvalidArgumentError, match="expected an integer"):
        c_integer(text)


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
