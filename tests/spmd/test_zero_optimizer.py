"""ZeroOptimizer: the trajectory of plain data-parallel training, with state split by rank."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import InvalidArgumentError
from ddp.optim import SGD, AdamW
from ddp.zero import ZeroOptimizer

SHARED_COMM = True  # COLLECTIVES_TEST_REUSE_COMM=1 may give every test one communicator

WORLD_SIZES = (1, 2, 4)
SHAPES = {"w": (5, 3), "b": (3,), "v": (7,)}  # 25 numbers: padded at 2 and 4 ranks
NUMEL = 25


def host(a):
    return a.get() if hasattr(a, "get") else a


def initial_params():
    rng = np.random.default_rng(0)
    return {name: rng.standard_normal(shape) for name, shape in SHAPES.items()}


def local_grads(step: int, rank: int):
    rng = np.random.default_rng(1000 * step + rank)
    return {name: rng.standard_normal(shape) for name, shape in SHAPES.items()}


OPTIMIZERS = {
    "adamw": lambda: AdamW(lr=0.05, weight_decay=0.1),
    "sgd-momentum": lambda: SGD(lr=0.1, momentum=0.9, weight_decay=0.01),
    "sgd-nesterov": lambda: SGD(lr=0.1, momentum=0.5, nesterov=True),
}


@pytest.mark.parametrize("stage", [1, 2, 3])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_trajectory_equals_unsharded(comm, xp, stage, name):
    steps = 4
    params = initial_params()
    if comm.rank != 0:  # broadcast_from=0 must make every rank start from rank 0's values
        params = {k: v + 1.0 for k, v in params.items()}
    zero = ZeroOptimizer(
        {k: xp.asarray(v) for k, v in params.items()}, comm, OPTIMIZERS[name](), stage=stage
    )

    reference, states, plain = initial_params(), {}, OPTIMIZERS[name]()
    for step in range(steps):
        grads = local_grads(step, comm.rank)
        zero.zero_grad()
        for k, g in grads.items():
            zero.grads[k][...] = xp.asarray(g)
        zero.step()
        mean = {
            k: sum(local_grads(step, r)[k] for r in range(comm.size)) / comm.size for k in SHAPES
        }
        plain.step(reference, mean, states)
        with zero.gathered() as current:  # stage 3 holds only a shard between steps
            for k in SHAPES:
                np.testing.assert_allclose(host(current[k]), reference[k], rtol=1e-12, atol=1e-14)
    lo, hi = zero.shard_range
    flat_mean = np.concatenate([mean[k].ravel() for k in SHAPES] + [np.zeros(hi * comm.size)])
    np.testing.assert_allclose(host(zero.grad_shard), flat_mean[lo:hi], rtol=1e-12)


def test_state_bytes_fall_as_one_over_size(comm, xp):
    """Measured on groups of 1, 2, ... up to the world size, split from the same world."""
    measured = {}
    group = 1
    while group <= comm.size:
        sub = comm.split(comm.rank // group)
        try:
            params = {k: xp.asarray(v) for k, v in initial_params().items()}
            zero = ZeroOptimizer(params, sub, AdamW())
            measured[group] = zero.state_nbytes
        finally:
            sub.close()
        group *= 2
    for group, nbytes in measured.items():
        shard = -(-NUMEL // group)
        assert nbytes == 2 * shard * 8  # two float64 moments per owned number
    sizes = sorted(measured)
    assert all(measured[a] > measured[b] for a, b in zip(sizes, sizes[1:]))
    assert measured[1] == 2 * NUMEL * 8


def test_stage3_holds_a_parameter_shard_between_steps(comm, xp):
    params = {k: xp.asarray(v) for k, v in initial_params().items()}
    zero = ZeroOptimizer(params, comm, SGD(lr=0.1), stage=3)
    shard = -(-NUMEL // comm.size)
    assert zero.params == {} and zero.param_nbytes == shard * 8
    with zero.gathered() as full:
        np.testing.assert_array_equal(host(full["w"]), host(params["w"]))
        assert zero.param_nbytes == (shard + shard * comm.size) * 8
    assert zero.params == {} and zero.param_nbytes == shard * 8
    stage2 = ZeroOptimizer(params, comm, SGD(lr=0.1), stage=2)
    assert stage2.param_nbytes == (shard + shard * comm.size) * 8


def test_zero_optimizer_errors(comm, xp):
    params = {k: xp.asarray(v) for k, v in initial_params().items()}
    with pytest.raises(InvalidArgumentError, match="stage must be 1, 2 or 3, got 4"):
        ZeroOptimizer(params, comm, SGD(lr=0.1), stage=4)
    with pytest.raises(InvalidArgumentError, match="params is empty"):
        ZeroOptimizer({}, comm, SGD(lr=0.1))
    with pytest.raises(InvalidArgumentError, match=r"mix dtypes \['float32', 'float64'\]"):
        ZeroOptimizer({"a": xp.zeros(2), "b": xp.zeros(2, np.float32)}, comm, SGD(lr=0.1))
    with pytest.raises(InvalidArgumentError, match="expected a floating dtype"):
        ZeroOptimizer({"a": xp.zeros(2, np.int32)}, comm, SGD(lr=0.1))
    with pytest.raises(InvalidArgumentError, match=r"broadcast_from must be in \[0, "):
        ZeroOptimizer(params, comm, SGD(lr=0.1), broadcast_from=comm.size)
