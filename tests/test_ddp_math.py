"""Pure pieces of ddp: clipping math, compression encodings, packing (no communicator)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from collectives import InvalidArgumentError
from ddp import clip_grad_norm
from ddp._buckets import assign_buckets, make_buckets
from ddp._pack import _PointerTable, pack, unpack
from ddp.hooks import Int8Quantize, PowerSGD


def test_clip_replicated_scales_to_max_norm():
    grads = {"a": np.array([3.0, 0.0]), "b": np.array([[0.0, 4.0]])}
    norm = clip_grad_norm(grads, 1.0)
    assert norm == pytest.approx(5.0)
    np.testing.assert_allclose(grads["a"], [0.6, 0.0], rtol=1e-5)
    np.testing.assert_allclose(grads["b"], [[0.0, 0.8]], rtol=1e-5)


def test_clip_below_max_norm_leaves_grads():
    grads = [np.array([0.3, 0.4], np.float32)]
    assert clip_grad_norm(grads, 1.0) == pytest.approx(0.5)
    np.testing.assert_array_equal(grads[0], np.array([0.3, 0.4], np.float32))


def test_clip_inf_norm_and_nonfinite():
    grads = [np.array([-3.0, 2.0]), np.array([1.0])]
    assert clip_grad_norm(grads, 1.5, norm_type=math.inf) == 3.0
    np.testing.assert_allclose(grads[0], [-1.5, 1.0], rtol=1e-5)
    bad = [np.array([np.nan, 1.0])]
    assert math.isnan(clip_grad_norm(bad, 1.0))
    assert bad[0][1] == 1.0


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (([np.ones(2)], 0.0), {}, "max_norm must be > 0, got 0.0"),
        ((np.ones(2), 1.0), {}, "grads must be a mapping or a sequence of arrays, got one array"),
        (([np.ones(2)], 1.0), {"norm_type": 1}, "norm_type must be 2 or inf, got 1"),
    ],
)
def test_clip_errors(args, kwargs, message):
    with pytest.raises(InvalidArgumentError, match=f"clip_grad_norm: {message}"):
        clip_grad_norm(*args, **kwargs)


def test_int8_quantize_per_chunk_bounds():
    hook = Int8Quantize(chunk_size=4)
    x = np.array([1.0, -0.5, 0.25, 0.0, 100.0, -50.0, 3.0, 0.0], np.float32)
    q, scales, approx = hook._quantize(x)
    assert q.dtype == np.int8 and scales.dtype == np.float32
    np.testing.assert_allclose(scales, [1 / 127, 100 / 127], rtol=1e-6)
    # each chunk's error is at most half a step of its own scale
    err = np.abs(approx - x).reshape(2, 4)
    assert (err <= scales[:, None] / 2 + 1e-7).all()
    assert approx[0] == pytest.approx(1.0) and approx[4] == pytest.approx(100.0)


def test_hook_argument_errors():
    with pytest.raises(InvalidArgumentError, match="PowerSGD: rank must be"):
        PowerSGD(rank=0)
    with pytest.raises(InvalidArgumentError, match="PowerSGD: start_iter must be"):
        PowerSGD(start_iter=-1)
    with pytest.raises(InvalidArgumentError, match="Int8Quantize: chunk_size must be"):
        Int8Quantize(chunk_size=0)


def test_pack_unpack_numpy():
    arrays = {"a": np.arange(6.0).reshape(2, 3), "b": np.arange(3.0) + 10, "c": np.array(7.0)}
    (bucket,) = make_buckets(assign_buckets(arrays), np)
    ordered = [arrays[n] for n in bucket.names]
    pack(bucket, ordered, _PointerTable())
    np.testing.assert_array_equal(bucket.buffer, [7, 10, 11, 12, 0, 1, 2, 3, 4, 5])
    bucket.buffer *= 2
    unpack(bucket, ordered, _PointerTable())
    np.testing.assert_array_equal(arrays["a"], 2 * np.arange(6.0).reshape(2, 3))
    assert arrays["c"] == 14.0


def test_clip_complex_uses_modulus():
    grads = [np.array([3j, 4.0 + 0j]), np.array([0.0])]
    assert clip_grad_norm(grads, 2.5) == pytest.approx(5.0)
    np.testing.assert_allclose(grads[0], [1.5j, 2.0], rtol=1e-5)
