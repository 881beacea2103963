"""examples/gpt_3d.py --precision: fp16 (loss scaled) and bf16 follow the float32 run on every
mesh of the launch; an overflow on one rank makes every rank skip; without a scaler, fp16
loses gradient. The 30-step figures are in docs/gpt_3d.md; the suite runs fewer steps."""

from __future__ import annotations

import numpy as np
import pytest

import collectives as col
from tests.spmd.test_gpt_3d import load_example

WORLD_SIZES = (1, 2, 4)
SMALL = dict(layers=4, hidden=16, heads=4, seq_len=8, steps=6)
# (dp, tp, pp, schedule, zero, sequence parallel) for each world size
MESHES = {
    1: [(1, 1, 1, "1f1b", 0, False)],
    2: [(2, 1, 1, "1f1b", 2, False), (1, 2, 1, "gpipe", 0, True), (1, 1, 2, "1f1b", 0, False)],
    4: [
        (2, 2, 1, "gpipe", 1, True),
        (1, 2, 2, "interleaved", 0, False),
        (2, 1, 2, "zero_bubble", 2, False),
    ],
}


def config(example, mesh, **extra):
    dp, tp, pp, schedule, zero, sp = mesh
    return example.Config(
        dp=dp, tp=tp, pp=pp, schedule=schedule, zero=zero, sequence_parallel=sp, **SMALL, **extra
    )


@pytest.fixture(scope="module")
def alone_fp16():
    """fp16 losses of the one-process model, on every rank (each on its own communicator)."""
    example = load_example()
    with col.init(backend="mpi") as world:
        alone = world.split(world.rank)
        losses = example.train(alone, example.Config(precision="fp16", **SMALL))
        alone.close()
    return losses


@pytest.mark.numpy_only(reason="bf16 runs on ml_dtypes' NumPy bfloat16")
def test_half_precision_follows_float32_on_every_mesh(comm, alone_fp16):
    example = load_example()
    for mesh in MESHES[comm.size]:
        fp32 = np.array(example.train(comm, config(example, mesh, precision="fp32")))
        for precision in ("fp16", "bf16"):
            half = np.array(example.train(comm, config(example, mesh, precision=precision)))
            assert np.all(np.abs(half / fp32 - 1) < 0.02), (mesh, precision, half, fp32)
            assert half[-1] < half[0]
            if precision == "fp16":
                # the same run on another mesh: equal to fp16's rounding, sums reordered
                assert np.all(np.abs(half / np.array(alone_fp16) - 1) < 2e-3), (mesh, half)


@pytest.mark.numpy_only(reason="fp16 arithmetic on NumPy")
def test_overflow_on_one_rank_makes_every_rank_skip(comm):
    example = load_example()
    mesh = MESHES[comm.size][-1]
    seen: dict = {}

    def observe(step, info):
        flat = [
            np.asarray(col.bfloat16_to_float32(p.array) if hasattr(p, "array") else p)
            for p in info["params"].values()
        ]
        seen[step] = (info["scale"], info["finite"], np.concatenate([f.ravel() for f in flat]))

    losses = example.train(
        comm, config(example, mesh, precision="fp16", inject_overflow=2), observe=observe
    )
    assert [seen[s][1] for s in range(SMALL["steps"])] == [True, True, False, True, True, True]
    assert seen[3][0] == seen[2][0] / 2 and seen[2][0] == seen[1][0]
    np.testing.assert_array_equal(seen[3][2], seen[2][2])  # step 2 changed nothing
    assert not np.array_equal(seen[2][2], seen[1][2])
    every = comm.mpi_comm.allgather((losses, seen[5][0], seen[5][2].tobytes()))
    dp, tp, pp = mesh[:3]
    for rank, (other_losses, scale, params) in enumerate(every):
        assert other_losses == losses and scale == seen[5][0]
        # data-parallel replicas hold the same parameters: nobody stepped alone
        same_place = [
            r
            for r in range(comm.size)
            if r % tp == rank % tp and r // (tp * dp) == rank // (tp * dp)
        ]
        assert all(every[r][2] == params for r in same_place)


def test_bad_precision_options_fail_before_communicating(comm):
    example = load_example()
    with pytest.raises(col.InvalidArgumentError, match="needs the loss scaler"):
        example.train(comm, example.Config(tp=comm.size, precision="bf16", inject_overflow=1))
    with pytest.raises(col.InvalidArgumentError, match="--precision fp8"):
        example.train(comm, example.Config(tp=comm.size, precision="fp8"))


@pytest.mark.numpy_only(reason="fp16 arithmetic on NumPy")
def test_without_a_scaler_fp16_loses_gradient(comm):
    if comm.size != 1:
        pytest.skip("one process shows it; the other launches run the meshes")
    example = load_example()
    # many tokens per step make the mean loss's gradient small, as in real training
    big = dict(global_batch=512, seq_len=64, layers=1, hidden=8, heads=2, steps=1)

    def step0_grads(**extra):
        got = {}
        example.train(
            comm,
            example.Config(**big, **extra),
            observe=lambda step, info: got.update(
                {k: np.asarray(v, np.float64).copy() for k, v in info["grads"].items()}
            ),
        )
        return np.concatenate([got[k].ravel() for k in sorted(got)])

    fp32 = step0_grads(precision="fp32")
    errors = {}
    for scale in ("none", "dynamic"):
        g = step0_grads(precision="fp16", loss_scale=scale)
        errors[scale] = float(np.median(np.abs(g - fp32)[fp32 != 0] / np.abs(fp32[fp32 != 0])))
    # the unscaled loss gradient is subnormal in float16: its bits are gone
    assert errors["none"] > 3 * errors["dynamic"], errors
