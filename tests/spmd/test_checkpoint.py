"""ddp.checkpoint across ranks: replicas written once, ZeRO 1-3 and DDP moved between each
other and other data-parallel sizes, tensor-parallel layers resharded, errors on every rank.

References are computed in each rank's process with NumPy (plain AdamW on the same
gradients, the full layer weights)."""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col
from ddp import (
    AdamW,
    DistributedDataParallel,
    LoadBalancer,
    ShardedArray,
    ZeroOptimizer,
    checkpoint,
)
from ddp.checkpoint import CheckpointError
from ddp.tensor_parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding

WORLD_SIZES = (2,)
pytestmark = pytest.mark.numpy_only(reason="the states here are NumPy arrays")


@pytest.fixture
def shared_dir():
    world = MPI.COMM_WORLD
    path = world.bcast(tempfile.mkdtemp(prefix="ckpt-") if world.rank == 0 else None)
    yield Path(path)
    world.Barrier()
    if world.rank == 0:
        shutil.rmtree(path, ignore_errors=True)


def alone(comm):
    return comm.split(comm.rank)


SHAPES = {"w": (5, 3), "b": (7,), "v": (2, 2, 3)}  # 34 elements: ZeRO shards cut inside w, b


def params_and_grads(steps):
    rng = np.random.default_rng(0)
    params = {n: rng.standard_normal(s) for n, s in SHAPES.items()}
    grads = [{n: rng.standard_normal(s) for n, s in SHAPES.items()} for _ in range(steps)]
    return params, grads


def reference(steps):
    """Plain AdamW over ``steps`` steps: parameters and moments."""
    params, grads = params_and_grads(steps)
    params = {n: p.copy() for n, p in params.items()}
    opt, states = AdamW(lr=0.05), {}
    for g in grads:
        opt.step(params, g, states)
    return params, states


def zero_trained(comm, stage, steps):
    params, grads = params_and_grads(steps)
    zero = ZeroOptimizer(params, comm, AdamW(lr=0.05), stage=stage)
    for g in grads:
        for name, value in g.items():
            zero.grads[name][...] = value  # the same on every rank: the mean is itself
        zero.step()
    return zero


def test_replicated_tensors_are_written_once_spread_over_ranks(comm, shared_dir):
    state = {f"t{i}": np.full(1000, float(i)) for i in range(4)}  # every rank holds all
    checkpoint.save(shared_dir, state, comm, step=1)
    index = json.loads((shared_dir / "step-00000001" / "index.json").read_text())
    files = [s["file"] for t in index["tensors"].values() for s in t["shards"]]
    assert len(files) == 4  # each tensor once
    counts = {f: files.count(f) for f in set(files)}
    assert len(counts) == min(comm.size, 4) and max(counts.values()) - min(counts.values()) <= 1


@pytest.mark.parametrize("saved_stage", [1, 2, 3])
def test_zero_state_loads_into_other_stages_sizes_and_plain_ddp(comm, shared_dir, saved_stage):
    zero = zero_trained(comm, saved_stage, steps=2)
    checkpoint.save(shared_dir, {"model": zero}, comm, step=2)
    want_params, want_states = reference(2)
    then_params, _ = reference(3)
    one = alone(comm)
    for target_comm, stage in ((comm, 1), (comm, 3), (one, 2)):
        fresh = ZeroOptimizer(
            {n: np.zeros(s) for n, s in SHAPES.items()}, target_comm, AdamW(lr=0.05), stage=stage
        )
        checkpoint.load(shared_dir, {"model": fresh}, comm)
        assert fresh.state["step"] == 2
        _, grads = params_and_grads(3)
        for name, value in grads[2].items():
            fresh.grads[name][...] = value
        fresh.step()  # one more step from the loaded moments gives the reference's third
        with fresh.gathered() if stage == 3 else nullcontext(fresh.params) as params:
            for name in SHAPES:
                np.testing.assert_allclose(params[name], then_params[name], rtol=1e-12)
    # and into plain DDP + AdamW on one rank
    params = {n: np.zeros(s) for n, s in SHAPES.items()}
    ddp = DistributedDataParallel(params, one)
    states: dict = {}
    opt = AdamW(lr=0.05)
    state = {"model": {"params": ddp, "optim": checkpoint.OptimizerState(opt, params, states)}}
    checkpoint.load(shared_dir, state, comm)
    for name in SHAPES:
        np.testing.assert_array_equal(params[name], want_params[name])
        np.testing.assert_allclose(
            states[name]["exp_avg"], want_states[name]["exp_avg"], rtol=1e-13
        )
        assert states[name]["step"] == 2
    one.close()


class nullcontext:
    def __init__(self, value):
        self.value = value

    def __enter__(self):
        return self.value

    def __exit__(self, *exc):
        return False


def test_tensor_parallel_layers_and_sharded_array_reshard(comm, shared_dir):
    rng = np.random.default_rng(1)
    size = comm.size
    w1, b1 = rng.standard_normal((3, 2 * size)), rng.standard_normal(2 * size)
    w2, b2 = rng.standard_normal((2 * size, 3)), rng.standard_normal(3)
    emb = rng.standard_normal((4 * size, 3))
    x = rng.standard_normal((5 * size + 1, 2))
    state = {
        "fc": ColumnParallelLinear(w1, b1, comm),
        "proj": RowParallelLinear(w2, b2, comm),
        "wte": VocabParallelEmbedding(emb, comm),
        "x": ShardedArray.shard(x, comm, axis=0),
    }
    checkpoint.save(shared_dir, state, comm, step=0)
    one = alone(comm)
    zeros = np.zeros_like
    fresh = {
        "fc": ColumnParallelLinear(zeros(w1), zeros(b1), one),
        "proj": RowParallelLinear(zeros(w2), zeros(b2), one),
        "wte": VocabParallelEmbedding(zeros(emb), one),
        "x": ShardedArray.shard(zeros(x), one, axis=0),
    }
    checkpoint.load(shared_dir, fresh, comm)
    np.testing.assert_array_equal(fresh["fc"].weight, w1)
    np.testing.assert_array_equal(fresh["fc"].bias, b1)
    np.testing.assert_array_equal(fresh["proj"].weight, w2)
    np.testing.assert_array_equal(fresh["proj"].bias, b2)
    np.testing.assert_array_equal(fresh["wte"].weight, emb)
    np.testing.assert_array_equal(fresh["x"].local, x)
    one.close()


def test_load_balancer_state(comm, shared_dir):
    lb = LoadBalancer(comm, global_batch=64)
    lb.record(0.1 * (comm.rank + 1), lb.local_batch)
    checkpoint.save(shared_dir, {"lb": lb}, comm, step=1)
    fresh = LoadBalancer(comm, global_batch=64)
    checkpoint.load(shared_dir, {"lb": fresh}, comm)
    assert fresh.shares == lb.shares and fresh.throughput == pytest.approx(lb.throughput)


def test_a_name_one_rank_lacks_is_an_error_on_every_rank(comm, shared_dir):
    checkpoint.save(shared_dir, {"a": np.ones(2), "step": 1}, comm, step=1)
    target = {"a": np.zeros(2), "step": None}
    if comm.rank == comm.size - 1:
        target["c"] = np.zeros(1)
    with pytest.raises(CheckpointError, match=r"names missing from the checkpoint: \['c'\]"):
        checkpoint.load(shared_dir, target, comm)
    assert target["a"].tolist() == [0.0, 0.0]


def test_ranks_that_disagree_on_a_shape_fail_together(comm, shared_dir):
    state = {"a": np.ones(2 + (comm.rank == 1))}
    with pytest.raises(col.InvalidArgumentError, match="ranks disagree on 'a'"):
        checkpoint.save(shared_dir, state, comm, step=1)
    assert checkpoint.latest(shared_dir) is None


def test_async_save_over_ranks(comm, shared_dir):
    local = np.full(4, float(comm.rank))
    state = {"x": checkpoint.Shard(local, (4 * comm.size,), (4 * comm.rank,)), "step": 7}
    handle = checkpoint.save(shared_dir, state, comm, step=7, async_op=True)
    local += 10
    path = handle.wait()
    target = {"x": np.zeros(4 * comm.size), "step": None}
    assert checkpoint.load(path, target, comm) == {"step": 7}
    np.testing.assert_array_equal(target["x"], np.repeat(np.arange(comm.size, dtype=float), 4))


def test_a_bad_state_on_one_rank_fails_every_rank_at_once(comm, shared_dir):
    bad = comm.rank == comm.size - 1
    state = {"a": np.ones(2, complex if bad else float)}
    match = "'a' has dtype complex128" if bad else "another rank's state is bad: rank"
    with pytest.raises(col.InvalidArgumentError, match=match):
        checkpoint.save(shared_dir, state, comm, step=1)
    checkpoint.save(shared_dir, {"a": np.ones(2)}, comm, step=1)
    target = {"a": object() if bad else np.zeros(2)}
    error = col.InvalidArgumentError if bad else CheckpointError
    with pytest.raises(error, match=r"state\['a'\] is a object"):
        checkpoint.load(shared_dir, target, comm)
    assert not list(shared_dir.glob(".tmp-*"))


def test_a_rank_that_cannot_write_fails_the_save_on_every_rank(comm, shared_dir, monkeypatch):
    import ddp.checkpoint._save as save_module

    if comm.rank == comm.size - 1:

        def full_disk(path, tensors, metadata):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(save_module, "write_safetensors", full_disk)
    state = {"x": checkpoint.Shard(np.ones(3), (3 * comm.size,), (3 * comm.rank,))}
    with pytest.raises(CheckpointError, match=f"rank {comm.size - 1}: OSError: .*No space left"):
        checkpoint.save(shared_dir, state, comm, step=1)
    comm.barrier()
    assert checkpoint.latest(shared_dir) is None and not list(shared_dir.glob(".tmp-*"))
