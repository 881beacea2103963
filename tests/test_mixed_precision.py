"""Mixed precision in one process: the loss scaler's rules and the optimizers' master weights."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import collectives as col
from ddp import SGD, AdamW, LossScaler, state_nbytes


def test_scaler_backs_off_on_overflow_and_grows_after_the_interval():
    scaler = LossScaler(init_scale=8.0, growth_interval=2)
    seen = []
    for grad in ([1.0], [np.inf], [1.0], [np.nan], [1.0], [1.0], [1.0]):
        g = np.array(grad, np.float32) * np.float32(scaler.scale)
        ok = scaler.unscale([g])
        seen.append((scaler.scale, ok))
        if ok:
            assert g[0] == 1.0  # divided back exactly (powers of two)
        scaler.update()
    assert seen == [
        (8.0, True),
        (8.0, False),
        (4.0, True),
        (4.0, False),
        (2.0, True),
        (2.0, True),
        (4.0, True),
    ]
    assert scaler.scale == 4.0 and scaler.skipped_steps == 2 and scaler.good_steps == 1


def test_scaler_state_round_trips_as_plain_numbers():
    scaler = LossScaler(init_scale=1024.0, growth_interval=3)
    for grad in (np.inf, 1.0):
        scaler.unscale([np.array([grad])])
        scaler.update()
    state = scaler.state_dict()
    assert state == {
        "scale": 512.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 3,
        "good_steps": 1,
        "skipped_steps": 1,
    }
    assert all(isinstance(v, (int, float)) for v in state.values())
    other = LossScaler()
    other.load_state_dict(state)
    assert other.state_dict() == state
    with pytest.raises(col.InvalidArgumentError, match="missing keys \\['scale'\\]"):
        other.load_state_dict({k: v for k, v in state.items() if k != "scale"})
    with pytest.raises(col.InvalidArgumentError, match="backoff_factor must be in \\(0, 1\\)"):
        other.load_state_dict({**state, "backoff_factor": 2.0})
    assert other.state_dict() == state  # a refused state changes nothing


def test_scaler_refuses_misuse():
    scaler = LossScaler()
    with pytest.raises(col.InvalidArgumentError, match="expected float32 or float64"):
        scaler.unscale({"w": np.zeros(2, np.float16)})
    with pytest.raises(col.InvalidArgumentError, match="expected float32 or float64"):
        scaler.unscale([col.as_bfloat16(np.zeros(2, np.uint16))])
    with pytest.raises(col.InvalidArgumentError, match="got one array"):
        scaler.unscale(np.zeros(2, np.float32))
    with pytest.raises(col.InvalidArgumentError, match="unscale\\(\\) was not called"):
        scaler.update()
    scaler.unscale([np.zeros(2, np.float32)])
    with pytest.raises(col.InvalidArgumentError, match="already called in this step"):
        scaler.unscale([np.zeros(2, np.float32)])
    for kwargs, message in (
        ({"init_scale": 0.0}, "init_scale must be > 0"),
        ({"growth_factor": 1.0}, "growth_factor must be > 1"),
        ({"backoff_factor": 1.0}, "backoff_factor must be in"),
        ({"growth_interval": 0}, "growth_interval must be an int >= 1"),
        ({"comm": [object()]}, "comm must be a communicator"),
    ):
        with pytest.raises(col.InvalidArgumentError, match=message):
            LossScaler(**kwargs)


def test_disabled_scaler_scales_by_one_and_never_skips():
    scaler = LossScaler(enabled=False)
    g = np.array([3.0, np.inf], np.float32)
    assert scaler.scale == 1.0 and scaler.unscale([g])
    assert g[0] == 3.0
    scaler.update()
    assert scaler.skipped_steps == 0


HALF_KINDS = ["float16", "bfloat16", "bits"]


def to_half(values: np.ndarray, kind: str):
    if kind == "float16":
        return values.astype(np.float16)
    if kind == "bfloat16":
        return values.astype(ml_dtypes.bfloat16)
    return col.as_bfloat16(col.float32_to_bfloat16(values.astype(np.float32)))


def half_to_float32(x) -> np.ndarray:
    if isinstance(x, col.BFloat16Array):
        return col.bfloat16_to_float32(x.array)
    return x.astype(np.float32)


@pytest.mark.parametrize("kind", HALF_KINDS)
@pytest.mark.parametrize("make", [lambda: SGD(lr=1e-3, momentum=0.9), lambda: AdamW(lr=1e-4)])
def test_master_weights_follow_the_float32_run_exactly(kind, make):
    rng = np.random.default_rng(0)
    start = to_half(rng.standard_normal(64), kind)
    reference = {"w": half_to_float32(start)}
    params = {"w": start}
    ref_states: dict = {}
    states: dict = {}
    ref_opt, opt = make(), make()
    for _ in range(20):
        grad = rng.standard_normal(64).astype(np.float32) * np.float32(1e-3)
        ref_opt.step(reference, {"w": grad}, ref_states)
        opt.step(params, {"w": grad}, states)
    # the master is the float32 run bit for bit; the parameter is it rounded once
    np.testing.assert_array_equal(states["w"]["master"], reference["w"])
    np.testing.assert_array_equal(
        half_to_float32(params["w"]), half_to_float32(to_half(reference["w"], kind))
    )
    assert np.all(reference["w"] != half_to_float32(start))  # every value moved in float32


def test_without_master_weights_small_updates_are_lost():
    # what the master copy prevents: 1e-4 steps on values near 1 vanish in float16
    w = np.ones(8, np.float16)
    SGD(lr=1e-4).update(w, np.ones(8, np.float16), {"step": 0})
    assert np.all(w == 1)
    params, states = {"w": np.ones(8, np.float16)}, {}
    for _ in range(10):
        SGD(lr=1e-4).step(params, {"w": np.ones(8, np.float32)}, states)
    assert np.all(params["w"] == np.float16(1 - 10 * 1e-4))


def test_state_nbytes_formula_for_adamw_on_half_parameters():
    params = {"w": np.zeros((10, 3), np.float16), "b": np.zeros(3, np.float16)}
    states: dict = {}
    AdamW().step(params, {k: np.zeros(v.shape, np.float32) for k, v in params.items()}, states)
    assert state_nbytes(states) == 33 * (4 + 8)  # float32 master + two float32 moments
