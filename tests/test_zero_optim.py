"""Optimizer math and the ZeRO flat layout, in-process (no communicator)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from collectives import InvalidArgumentError
from ddp.optim import SGD, AdamW
from ddp.zero import flat_layout


def adamw_reference(p, grads, lr, b1, b2, eps, wd):
    """AdamW written out scalar by scalar, as in the paper (Loshchilov & Hutter, Algorithm 2)."""
    p = list(p)
    m = [0.0] * len(p)
    v = [0.0] * len(p)
    for t, g in enumerate(grads, start=1):
        for i in range(len(p)):
            p[i] -= lr * wd * p[i]
            m[i] = b1 * m[i] + (1 - b1) * g[i]
            v[i] = b2 * v[i] + (1 - b2) * g[i] ** 2
            mhat, vhat = m[i] / (1 - b1**t), v[i] / (1 - b2**t)
            p[i] -= lr * mhat / (math.sqrt(vhat) + eps)
    return p


def test_adamw_matches_scalar_reference():
    rng = np.random.default_rng(0)
    p0, grads = rng.standard_normal(6), [rng.standard_normal(6) for _ in range(5)]
    opt = AdamW(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1)
    p, state = p0.copy(), opt.init_state(p0)
    for g in grads:
        opt.update(p, g, state)
    # Adam's eps sits outside sqrt(vhat) in both; the difference is only rounding.
    np.testing.assert_allclose(
        p, adamw_reference(p0, grads, 0.01, 0.8, 0.99, 1e-6, 0.1), rtol=1e-13
    )
    assert state["step"] == 5


def test_sgd_momentum_matches_scalar_reference():
    rng = np.random.default_rng(1)
    p0, grads = rng.standard_normal(4), [rng.standard_normal(4) for _ in range(4)]
    lr, mu, wd = 0.1, 0.9, 0.01
    expected, buf = p0.copy(), None
    for g in grads:
        d = g + wd * expected
        buf = d.copy() if buf is None else mu * buf + d
        expected = expected - lr * buf
    opt = SGD(lr=lr, momentum=mu, weight_decay=wd)
    p, state = p0.copy(), opt.init_state(p0)
    for g in grads:
        opt.update(p, g, state)
    np.testing.assert_allclose(p, expected, rtol=1e-14)


def test_sgd_plain_and_nesterov():
    p, g = np.array([1.0, -2.0]), np.array([0.5, 0.25])
    opt = SGD(lr=0.5)
    state = opt.init_state(p)
    assert state == {"step": 0}
    opt.update(p, g, state)
    np.testing.assert_array_equal(p, [0.75, -2.125])
    nes = SGD(lr=1.0, momentum=0.5, nesterov=True)
    q, s = np.zeros(1), nes.init_state(np.zeros(1))
    nes.update(q, np.ones(1), s)  # buf = 1, step = g + 0.5 * buf = 1.5
    nes.update(q, np.ones(1), s)  # buf = 1.5, step = 1 + 0.75 = 1.75
    np.testing.assert_array_equal(q, [-3.25])


@pytest.mark.parametrize("opt", [AdamW(lr=0.1), SGD(lr=0.1, momentum=0.9)], ids=["adamw", "sgd"])
def test_update_on_shards_equals_update_on_whole(opt):
    """The property ZeRO rests on: the updates are elementwise, so shards compose exactly."""
    rng = np.random.default_rng(2)
    whole, grads = rng.standard_normal(10), [rng.standard_normal(10) for _ in range(3)]
    parts = [whole[:4].copy(), whole[4:].copy()]
    state_whole, states = opt.init_state(whole), [opt.init_state(p) for p in parts]
    for g in grads:
        opt.update(whole, g, state_whole)
        opt.update(parts[0], g[:4], states[0])
        opt.update(parts[1], g[4:], states[1])
    np.testing.assert_array_equal(np.concatenate(parts), whole)


def test_step_over_a_mapping_keeps_state_per_name():
    params = {"a": np.ones(2), "b": np.ones(3)}
    states: dict = {}
    AdamW(lr=0.1).step(params, {"a": np.ones(2), "b": -np.ones(3)}, states)
    assert sorted(states) == ["a", "b"] and states["a"]["exp_avg"].shape == (2,)
    assert params["a"][0] < 1.0 < params["b"][0]


def test_optimizer_errors():
    with pytest.raises(InvalidArgumentError, match="SGD: lr must be >= 0, got -1"):
        SGD(lr=-1)
    with pytest.raises(InvalidArgumentError, match="nesterov=True needs momentum > 0"):
        SGD(lr=0.1, nesterov=True)
    with pytest.raises(InvalidArgumentError, match=r"betas must be two numbers in \[0, 1\)"):
        AdamW(betas=(0.9, 1.0))
    with pytest.raises(InvalidArgumentError, match="AdamW: eps must be >= 0"):
        AdamW(eps=-1e-8)


def test_flat_layout_pads_to_a_multiple_of_size():
    layout = flat_layout({"w": (2, 3), "b": (3,)}, 4)
    assert layout.offsets == {"w": (0, 6), "b": (6, 9)}
    assert (layout.numel, layout.shard, layout.padded) == (9, 3, 12)
    assert [layout.shard_range(r) for r in range(4)] == [(0, 3), (3, 6), (6, 9), (9, 12)]
    assert flat_layout({"w": (4,)}, 2).padded == 4
    with pytest.raises(InvalidArgumentError, match="size must be >= 1, got 0"):
        flat_layout({"w": (4,)}, 0)
