"""Host-side numerics shared by the backends and ddp: bfloat16 rounding. (AVG's integer
division is tested through ``all_reduce`` in tests/spmd/test_collectives_verbs.py.)"""

from __future__ import annotations

import numpy as np
import pytest

from collectives import bfloat16_to_float32, float32_to_bfloat16


def _to_bf16(values) -> np.ndarray:
    values = np.asarray(values, np.float32)
    out = np.empty(values.shape, np.uint16)
    float32_to_bfloat16(values, out)
    return out


def _bits(words) -> np.ndarray:
    return np.asarray(words, np.uint32).view(np.float32)


def test_bfloat16_round_trip_is_exact_for_representable_values():
    values = np.array([0, 1, -1, 2, 3, 0.5, 255, -256, 1e30, -1e-30, np.inf, -np.inf], np.float32)
    bits = _to_bf16(values)
    back = bfloat16_to_float32(bits)
    assert back.dtype == np.float32
    # All exactly representable in bfloat16 except 1e30 and -1e-30, which round.
    np.testing.assert_array_equal(back[:8], values[:8])
    np.testing.assert_array_equal(back[10:], values[10:])
    assert np.isclose(back[8], 1e30, rtol=2**-8) and np.isclose(back[9], -1e-30, rtol=2**-8)


def test_bfloat16_to_float32_shifts_bits():
    bits = np.array([0x3F80, 0xBF80, 0x4000, 0x7F80, 0x0000, 0x8000], np.uint16)
    np.testing.assert_array_equal(
        bfloat16_to_float32(bits), np.array([1, -1, 2, np.inf, 0, -0.0], np.float32)
    )
    assert np.signbit(bfloat16_to_float32(bits)[5])


@pytest.mark.parametrize(
    "word,expected",
    [
        (0x3F800000, 0x3F80),  # 1.0 exact
        (0x3F807FFF, 0x3F80),  # just below half: down
        (0x3F808000, 0x3F80),  # exactly half, even below: stays even
        (0x3F818000, 0x3F82),  # exactly half, odd below: up to even
        (0x3F808001, 0x3F81),  # just above half: up
        (0xBF808001, 0xBF81),  # negative values round on magnitude
        (0xBF808000, 0xBF80),
        (0x7F7FFFFF, 0x7F80),  # largest float32 rounds to inf
        (0x7F800000, 0x7F80),  # inf stays inf
        (0x00000001, 0x0000),  # tiny denormal rounds to zero
        (0x80000000, 0x8000),  # -0.0 keeps its sign
    ],
)
def test_float32_to_bfloat16_rounds_to_nearest_even(word, expected):
    assert int(_to_bf16(_bits([word]))[0]) == expected


def test_float32_to_bfloat16_keeps_shape_and_writes_into_out():
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = np.full((3, 4), 0xFFFF, np.uint16)
    float32_to_bfloat16(values, out)
    np.testing.assert_array_equal(bfloat16_to_float32(out), values)


@pytest.mark.parametrize("word", [0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FFFFFFF, 0xFFFFFFFF])
def test_bfloat16_nan_stays_nan(word):
    bits = _to_bf16(_bits([word]))
    assert np.isnan(bfloat16_to_float32(bits))[0], hex(int(bits[0]))


def test_float32_to_bfloat16_allocates_out_when_none():
    values = np.array([[1.0, -2.5], [np.nan, -np.nan]], np.float32)
    bits = float32_to_bfloat16(values)
    assert bits.dtype == np.uint16 and bits.shape == (2, 2)
    assert bits.tolist() == [[0x3F80, 0xC020], [0x7FC0, 0xFFC0]]  # NaNs quiet, sign kept


def test_bfloat16_of_a_0d_array():
    bits = float32_to_bfloat16(np.array(np.float32(2.5)))
    assert bits.shape == () and float(bfloat16_to_float32(bits)) == 2.5
