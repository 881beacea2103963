"""Bucket assignment (pure) and the flat buffers with their views."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import InvalidArgumentError
from ddp._buckets import assign_buckets, make_buckets

MB = 1 << 20


def f32(n):
    return ((n,), np.float32)


def test_docstring_example():
    q = MB // 4  # float32 values per MiB
    specs = assign_buckets(
        {"a": f32(q), "b": f32(q), "c": f32(q // 2), "d": f32(q // 2)},
        bucket_cap_mb=2,
        first_bucket_cap_mb=1,
    )
    assert [s.names for s in specs] == [("d", "c"), ("b", "a")]
    assert [s.offsets for s in specs] == [(0, q // 2), (0, q)]
    assert [s.nbytes for s in specs] == [MB, 2 * MB]


def test_reverse_order_and_caps_respected():
    params = {f"p{i}": f32(1000) for i in range(20)}  # 4000 bytes each
    cap = 10_000 / MB
    specs = assign_buckets(params, bucket_cap_mb=cap, first_bucket_cap_mb=4000 / MB)
    names = [n for s in specs for n in s.names]
    assert names == [f"p{i}" for i in reversed(range(20))]
    assert specs[0].names == ("p19",)  # first bucket: one tensor fits its 4000-byte cap
    assert all(s.nbytes <= 10_000 for s in specs)
    assert [len(s.names) for s in specs] == [1, 2, 2, 2, 2, 2, 2, 2, 2, 2, 1]
    assert [s.index for s in specs] == list(range(len(specs)))


def test_oversized_parameter_gets_its_own_bucket():
    specs = assign_buckets(
        {"big": f32(MB), "small": f32(10)}, bucket_cap_mb=1, first_bucket_cap_mb=1
    )
    assert [s.names for s in specs] == [("small",), ("big",)]


def test_one_dtype_per_bucket_sorted_by_completion():
    params = {
        "a": ((4,), np.float64),
        "b": ((4,), np.float32),
        "c": ((4,), np.float64),
        "d": ((4,), np.float32),
        "e": ((2, 2), np.float16),
    }
    specs = assign_buckets(params, bucket_cap_mb=1, first_bucket_cap_mb=1)
    for s in specs:
        assert len({np.dtype(params[n][1]) for n in s.names}) == 1
        assert s.dtype == np.dtype(params[s.names[0]][1])
    # reverse order e, d, c, b, a: float16 {e} fills first... all buckets stay open to the end,
    # so they are ordered by their last-assigned parameter: e (pos 0), b (pos 3), a (pos 4)
    assert [s.names for s in specs] == [("e",), ("d", "b"), ("c", "a")]


def test_deterministic_and_accepts_arrays():
    arrays = {f"w{i}": np.zeros((i + 1, 3), np.float32) for i in range(7)}
    pairs = {k: (v.shape, v.dtype) for k, v in arrays.items()}
    a = assign_buckets(arrays, bucket_cap_mb=40 / MB, first_bucket_cap_mb=20 / MB)
    b = assign_buckets(pairs, bucket_cap_mb=40 / MB, first_bucket_cap_mb=20 / MB)
    assert a == b


def test_views_share_the_flat_buffer():
    params = {"w": ((2, 3), np.float64), "b": ((3,), np.float64), "s": ((), np.float64)}
    (bucket,) = make_buckets(assign_buckets(params), np)
    assert bucket.names == ("s", "b", "w")
    assert bucket.buffer.shape == (10,)
    bucket.views["w"][...] = np.arange(6).reshape(2, 3)
    bucket.views["s"][...] = -1
    np.testing.assert_array_equal(bucket.buffer, [-1, 0, 0, 0, 0, 1, 2, 3, 4, 5])
    assert np.shares_memory(bucket.views["b"], bucket.buffer)
    assert bucket.nbytes == 80


@pytest.mark.parametrize("kw", [{"bucket_cap_mb": 0}, {"first_bucket_cap_mb": -1.0}])
def test_bad_caps(kw):
    with pytest.raises(InvalidArgumentError, match="assign_buckets: .*cap_mb must be > 0"):
        assign_buckets({"a": f32(3)}, **kw)
