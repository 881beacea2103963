"""Mixed precision across ranks: ZeRO's sharded master weights, DDP's float32 reduction and
the loss scaler's agreement over every rank of a mesh."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import collectives as col
from ddp import (
    SGD,
    AdamW,
    DistributedDataParallel,
    LossScaler,
    ZeroOptimizer,
    clip_grad_norm,
    hooks,
)

SHARED_COMM = True  # COLLECTIVES_TEST_REUSE_COMM=1 may give every test one communicator

SHAPES = {"w": (7, 5), "b": (3,)}  # 38 elements: padded at 4 ranks


def half(values: np.ndarray, kind: str, xp):
    if kind == "float16":
        return xp.asarray(values.astype(np.float16))
    if kind == "bfloat16":
        return values.astype(ml_dtypes.bfloat16)
    return col.as_bfloat16(xp.asarray(col.float32_to_bfloat16(values.astype(np.float32))))


def as_float32(x) -> np.ndarray:
    if isinstance(x, col.BFloat16Array):
        x = col.bfloat16_to_float32(x.array)
    x = x.get() if hasattr(x, "get") else x
    return np.asarray(x).astype(np.float32)


def kinds(xp):
    # ml_dtypes' bfloat16 is a NumPy dtype; CuPy carries bfloat16 as declared bits
    return ["float16", "bits"] + (["bfloat16"] if xp is np else [])


def rank_grads(rank: int, step: int) -> dict[str, np.ndarray]:
    # multiples of 1/8 below 4: exact in every half precision, and so is their mean
    rng = np.random.default_rng([rank, step])
    return {k: rng.integers(-32, 32, size=s) / 8.0 for k, s in SHAPES.items()}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_keeps_float32_master_and_state_for_its_shard_only(comm, xp, stage):
    for kind in kinds(xp):
        rng = np.random.default_rng(0)
        start = {k: rng.standard_normal(s) for k, s in SHAPES.items()}
        params = {k: half(v, kind, xp) for k, v in start.items()}
        opt = ZeroOptimizer(params, comm, AdamW(lr=1e-3), stage=stage)
        reference = {k: as_float32(p) for k, p in params.items()}
        ref_states: dict = {}
        for step in range(3):
            if stage == 3:
                opt.gather_params()
            for name, g in opt.grads.items():
                values = half(rank_grads(comm.rank, step)[name], kind, xp)
                dst = g.array if isinstance(g, col.BFloat16Array) else g
                dst[...] = values.array if isinstance(values, col.BFloat16Array) else values
            opt.step()
            if stage == 3:
                opt.release_params()
            mean = {
                k: np.mean([rank_grads(r, step)[k] for r in range(comm.size)], axis=0).astype(
                    np.float32
                )
                for k in SHAPES
            }
            AdamW(lr=1e-3).step(reference, mean, ref_states)
        flat = np.concatenate([reference[k].ravel() for k in SHAPES])
        lo, hi = opt.shard_range
        shard = np.zeros(hi - lo, np.float32)
        shard[: max(0, min(hi, flat.size) - lo)] = flat[lo:hi]
        np.testing.assert_allclose(as_float32(opt.master_shard), shard, rtol=1e-6, atol=1e-7)
        with opt.gathered() if stage == 3 else _held(opt) as held:
            for k in SHAPES:
                expected = as_float32(half(reference[k].astype(np.float64), kind, np))
                np.testing.assert_allclose(as_float32(held[k]), expected, rtol=1e-2, atol=0)
        # the documented formula: AdamW's two moments and the master, float32, for the shard
        n, s = opt.layout.padded, opt.layout.shard
        assert opt.state_nbytes == s * (8 + 4)
        assert opt.param_nbytes == (2 * s if stage == 3 else 2 * n + 2 * s)
        assert opt.grad_nbytes == 2 * n + (0 if stage == 1 else 2 * s) + 4 * s


class _held:
    def __init__(self, opt):
        self.opt = opt

    def __enter__(self):
        return self.opt.params

    def __exit__(self, *exc):
        return False


def test_zero_master_takes_parameters_written_through_the_views(comm, xp):
    params = {k: half(np.ones(s), "float16", xp) for k, s in SHAPES.items()}
    opt = ZeroOptimizer(params, comm, SGD(lr=0.0), stage=2)
    opt.params["w"][...] = 3.0  # loaded from elsewhere, say
    opt.step()
    assert float(opt.params["w"].min()) == 3.0 and float(opt.params["b"].max()) == 1.0
    assert set(np.unique(as_float32(opt.master_shard))) <= {0.0, 1.0, 3.0}


@pytest.mark.parametrize("hook", [None, hooks.fp16_compress, hooks.bf16_compress])
def test_ddp_reduces_half_gradients_in_float32(comm, xp, hook):
    for kind in kinds(xp):
        params = {k: half(np.zeros(s), kind, xp) for k, s in SHAPES.items()}
        ddp = DistributedDataParallel(params, comm, reduce_dtype="float32", hook=hook)
        assert all(b.dtype == np.float32 for b in ddp.buckets)
        # with no compression, values float16 would hold in a few bits (or flush to zero)
        # arrive exact to float32; through a compressed wire, to the wire's rounding
        size = 1e-7 if hook is None else 1.0
        mine = {k: rank_grads(comm.rank, 0)[k] * size for k in SHAPES}
        ddp.zero_grad()
        for name in reversed(list(SHAPES)):
            ddp.grads[name][...] = xp.asarray(mine[name].astype(np.float32))
            ddp.mark_ready(name)
        ddp.finish()
        bound = {None: 1e-6, hooks.fp16_compress: 2.0**-11, hooks.bf16_compress: 2.0**-8}[hook]
        for k in SHAPES:
            mean = np.mean([rank_grads(r, 0)[k] * size for r in range(comm.size)], axis=0)
            err = np.abs(as_float32(ddp.grads[k]) - mean).max()
            assert err <= bound * np.abs(mean).max(), (kind, hook, k, err)


def test_ddp_float32_buckets_then_unscale_then_clip(comm, xp):
    """The recipe's order: reduce in float32, unscale, clip (norm in float32 over every
    rank's gradients), update through the master weights."""
    params = {k: half(np.ones(s), "float16", xp) for k, s in SHAPES.items()}
    ddp = DistributedDataParallel(params, comm, reduce_dtype="float32")
    scaler = LossScaler(comm, init_scale=2.0**10)
    opt, states = SGD(lr=0.5), {}
    grads = {k: half(rank_grads(comm.rank, 1)[k] * scaler.scale, "float16", xp) for k in SHAPES}
    ddp.sync_gradients(grads)
    assert scaler.unscale(ddp.grads)
    norm = clip_grad_norm(ddp.grads, 1.0)
    mean = {k: np.mean([rank_grads(r, 1)[k] for r in range(comm.size)], axis=0) for k in SHAPES}
    expected = float(np.sqrt(sum((v**2).sum() for v in mean.values())))
    assert norm == pytest.approx(expected, rel=1e-6)
    opt.step(params, ddp.grads, states)
    scaler.update()
    for k in SHAPES:
        want = 1 - 0.5 * mean[k] * min(1.0, 1.0 / (expected + 1e-6))
        np.testing.assert_allclose(as_float32(states[k]["master"]), want, rtol=1e-6)
        np.testing.assert_array_equal(as_float32(params[k]), want.astype(np.float16))


def test_one_rank_overflowing_makes_every_rank_skip(comm, xp):
    mesh = col.DeviceMesh(comm, {"dp": comm.size, "tp": 1})
    for scaler in (LossScaler(comm, init_scale=64.0), LossScaler([mesh["dp"], mesh["tp"]])):
        before = scaler.scale
        for bad_rank in range(comm.size):
            g = xp.full(4, 2.0 * scaler.scale, dtype=xp.float32)
            if comm.rank == bad_rank:
                g[1] = xp.inf
            assert scaler.unscale({"g": g}) is False
            scaler.update()
        assert scaler.scale == before * 0.5**comm.size
        assert scaler.skipped_steps == comm.size
        g = xp.full(4, 2.0 * scaler.scale, dtype=xp.float32)
        assert scaler.unscale([g]) is True
        assert float(g.max()) == 2.0
        scaler.update()
    mesh.close()


def test_bad_arguments_fail_before_communicating(comm, xp):
    params = {"w": xp.zeros(3, dtype=xp.float16)}
    with pytest.raises(col.InvalidArgumentError, match="reduce_dtype must be None or 'float32'"):
        DistributedDataParallel(params, comm, reduce_dtype="float16")
    bits = {"w": col.as_bfloat16(xp.zeros(3, dtype=xp.uint16))}
    with pytest.raises(col.InvalidArgumentError, match="need reduce_dtype='float32'"):
        DistributedDataParallel(bits, comm)
    mixed = {"w": xp.zeros(3, dtype=xp.float16), "b": col.as_bfloat16(xp.zeros(3, xp.uint16))}
    with pytest.raises(col.InvalidArgumentError, match="params mix dtypes"):
        ZeroOptimizer(mixed, comm, SGD(lr=0.1))


@pytest.mark.numpy_only(reason="the benchmark runs on the MPI backend")
def test_benchmark_bytes_per_parameter_match_the_formula(comm):
    from benchmarks.mixed_precision import KINDS, PRECISIONS, Setup, formula

    shapes = {"a": (10, 7), "b": (5,)}  # 75 parameters: padded at 2 and 4 ranks
    for kind in KINDS:
        for precision in PRECISIONS:
            setup = Setup(comm, kind, precision, shapes)
            setup.step()
            assert setup.held() == formula(kind, precision, 75, comm.size), (kind, precision)
    # the formula itself, by hand: float16 + master under DDP is 2 + 4 + 12 bytes a parameter
    assert formula("ddp", "float16+master", 75, 4) == {"params": 150, "grads": 300, "state": 900}
    # ZeRO-3 at 4 ranks: shard 19 of a 76-element padded space
    assert formula("zero3", "float16+master", 75, 4) == {
        "params": 38,
        "grads": 152 + 38 + 76,
        "state": 228,
    }
