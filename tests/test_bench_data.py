"""The benchmark's check data: every reduction exact in its dtype; references right."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks import _data
from benchmarks._case import Case
from collectives import InvalidArgumentError

SIZES = (1, 2, 3, 4, 8)


def _exact(redop, size, dtype, length):
    """The reduction over ranks in int64 (exact for these small integers)."""
    ranks = [_data.values(redop, r, size, dtype, 0, length).astype(np.int64) for r in range(size)]
    if redop == "avg":
        total = sum(ranks)
        assert (total % size == 0).all(), "avg data must sum to a multiple of size"
        return total // size
    combine = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}[redop]
    out = ranks[0]
    for r in ranks[1:]:
        out = combine(out, r)
    return out


@pytest.mark.parametrize("dtype", _data.DTYPES)
@pytest.mark.parametrize("redop", _data.REDOPS)
@pytest.mark.parametrize("size", SIZES)
def test_reductions_exact(dtype, redop, size):
    dt = np.dtype(dtype)
    got = _data.reduced(redop, size, dt, 0, 200)
    assert got.dtype == dt
    np.testing.assert_array_equal(got.astype(np.int64), _exact(redop, size, dt, 200))


@pytest.mark.parametrize("redop", _data.REDOPS)
def test_data_depends_on_rank_and_index(redop):
    a = _data.values(redop, 0, 4, np.dtype("float32"), 0, 64)
    b = _data.values(redop, 1, 4, np.dtype("float32"), 0, 64)
    assert len(np.unique(a)) > 1 and not np.array_equal(a, b)


def test_values_offset():
    dt = np.dtype("int32")
    whole = _data.values("none", 2, 3, dt, 0, 300)
    np.testing.assert_array_equal(_data.values("none", 2, 3, dt, 123, 50), whole[123:173])
    np.testing.assert_array_equal(
        _data.reduced("sum", 3, dt, 7, 20), _data.reduced("sum", 3, dt, 0, 27)[7:]
    )


def test_expected_per_op():
    dt, n, c = np.dtype("int64"), 3, 5
    sends = [
        {op: _data.send_data(op, "none", r, n, dt, c, 1) for op in ("all_to_all", "scatter")}
        for r in range(n)
    ]
    for rank in range(n):
        got = _data.expected("all_to_all", "none", rank, n, dt, c, 0)
        np.testing.assert_array_equal(got, np.stack([s["all_to_all"][rank] for s in sends]))
        got = _data.expected("scatter", "none", rank, n, dt, c, 1)
        np.testing.assert_array_equal(got, sends[1]["scatter"][rank])
        got = _data.expected("sendrecv", "none", rank, n, dt, c, 0)
        np.testing.assert_array_equal(got, _data.values("none", (rank - 1) % n, n, dt, 0, c))
        sums = sum(_data.send_data("reduce_scatter", "sum", r, n, dt, c, 0) for r in range(n))
        got = _data.expected("reduce_scatter", "sum", rank, n, dt, c, 0)
        np.testing.assert_array_equal(got, sums[rank])
    assert _data.expected("reduce", "sum", 1, n, dt, c, 0) is None
    assert _data.expected("gather", "none", 1, n, dt, c, 0) is None
    assert _data.expected("gather", "none", 0, n, dt, c, 0).shape == (n, c)


def test_count_wrong():
    want = np.arange(6.0)
    got = want.copy()
    got[[1, 4]] = np.nan
    assert _data.count_wrong(got, want) == 2
    assert _data.count_wrong(want, want) == 0
    assert _data.count_wrong(want[:3], want) == 6  # wrong shape: all wrong
    assert _data.count_wrong(None, None) == 0


def test_sentinel_never_matches():
    assert np.isnan(_data.sentinel((3,), np.dtype("float16"))).all()
    assert (_data.sentinel((3,), np.dtype("uint8")) == 255).all()


def test_bad_redop_and_dtype():
    with pytest.raises(
        InvalidArgumentError, match=r"reduce op \(-o\) must be one of .* got 'mean'"
    ):
        _data.values("mean", 0, 2, np.dtype("float32"), 0, 4)
    with pytest.raises(
        InvalidArgumentError, match=r"dtype \(-d\) must be one of int8, .* got 'float8'"
    ):
        _data.storage_dtype("float8")
    assert _data.storage_dtype("int8") == np.dtype("int8")


@pytest.mark.parametrize("kind", ["sum", "prod", "max", "min", "avg"])
@pytest.mark.parametrize("n", [2, 3, 8])
def test_bfloat16_results_are_exact(kind, n):
    """bfloat16 data are uint16 bits; the expected result is the reduction of their values."""
    bf16 = _data.storage_dtype("bfloat16")
    assert _data.type_name(bf16) == "bfloat16" and _data.type_name(np.dtype("float16")) == "half"

    def value(bits):
        return (bits.astype(np.uint32) << 16).view(np.float32)

    data = np.stack([value(_data.values(kind, r, n, bf16, 0, 50)) for r in range(n)])
    want = {"sum": data.sum(0), "prod": data.prod(0), "max": data.max(0), "min": data.min(0),
            "avg": data.sum(0) / n}[kind]  # fmt: skip
    np.testing.assert_array_equal(value(_data.reduced(kind, n, bf16, 0, 50)), want)


@pytest.mark.parametrize("op", ["all_gather", "gather", "reduce_scatter", "scatter", "all_to_all"])
def test_case_buffers(op):
    dt = np.dtype("float32")
    out_of_place = Case(op, False, "sum", dt, 4, 0, 1, 3, np)
    in_place = Case(op, True, "sum", dt, 4, 0, 1, 3, np)
    assert out_of_place.buf is None and in_place.send is None
    assert np.isnan(out_of_place.recv).all()
    if op == "all_gather":  # rank 1's block already in place, the rest unwritten
        np.testing.assert_array_equal(in_place.buf[1], out_of_place.send)
        assert np.isnan(in_place.buf[[0, 2]]).all()
    in_place.buf[...] = 0
    in_place.reset()
    assert not (in_place.buf == 0).all()
