"""examples/gpt_3d.py: every mesh and schedule gives the losses of the one-process model.

The reference is computed in the same launch, on a communicator of one rank; the meshes
cover dp, tp and pp in pairs at 4 ranks (2x2x2 at 8 ranks: docs/gpt_3d.md).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import collectives as col
from ddp.tensor_parallel import allreduce_sequence_parallel_grads, vocab_parallel_cross_entropy

WORLD_SIZES = (4,)
SMALL = dict(layers=4, hidden=16, heads=4, seq_len=8, steps=3)  # a block on every pp stage
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "gpt_3d.py"


def load_example():
    if "gpt_3d_example" not in sys.modules:  # dataclasses look their module up by name
        spec = importlib.util.spec_from_file_location("gpt_3d_example", EXAMPLE)
        module = importlib.util.module_from_spec(spec)
        sys.modules["gpt_3d_example"] = module
        spec.loader.exec_module(module)
    return sys.modules["gpt_3d_example"]


def test_docstring_starts_with_the_launch_command():
    first = load_example().__doc__.splitlines()[0]
    assert first == "mpiexec -n 8 python examples/gpt_3d.py --dp 2 --tp 2 --pp 2"


# (dp, tp, pp, schedule, zero, sequence parallel)
MESHES = [
    (2, 2, 1, "1f1b", 0, False),
    (2, 2, 1, "gpipe", 2, True),
    (1, 2, 2, "interleaved", 0, True),
    (1, 2, 2, "zero_bubble", 0, False),
    (2, 1, 2, "zero_bubble", 1, False),
    (2, 1, 2, "interleaved", 2, False),
    (1, 4, 1, "gpipe", 0, True),
    (1, 1, 4, "1f1b", 0, False),
    (1, 2, 2, "zero_bubble_v", 0, True),
    (2, 1, 2, "dualpipe_v", 1, False),
    (1, 2, 2, "interleaved_zero_bubble", 2, False),
]


@pytest.fixture(scope="module")
def reference():
    """Losses of ``--dp 1 --tp 1 --pp 1``, on every rank (each on its own communicator)."""
    example = load_example()
    with col.init(backend="mpi") as world:
        alone = world.split(world.rank)
        losses = example.train(alone, example.Config(**SMALL))
        alone.close()
    return losses


@pytest.mark.numpy_only(reason="the reference runs on a NumPy communicator of one rank")
@pytest.mark.parametrize("dp,tp,pp,schedule,zero,sp", MESHES)
def test_mesh_matches_one_process(comm, reference, dp, tp, pp, schedule, zero, sp):
    example = load_example()
    cfg = example.Config(
        dp=dp, tp=tp, pp=pp, schedule=schedule, zero=zero, sequence_parallel=sp, **SMALL
    )
    losses = example.train(comm, cfg)
    assert losses == pytest.approx(reference, rel=1e-9)
    assert losses[-1] < losses[0]  # it trains


def test_float32_on_the_backend_array_module(comm, xp):
    example = load_example()
    cfg = example.Config(dp=2, tp=2, pp=1, dtype="float32", steps=2, sequence_parallel=True)
    losses = example.train(comm, cfg, xp)
    assert len(losses) == 2 and all(np.isfinite(losses))


def test_bad_mesh_fails_on_every_rank_before_communicating(comm):
    example = load_example()
    with pytest.raises(col.InvalidArgumentError, match="dp\\*tp\\*pp = 8"):
        example.train(comm, example.Config(dp=2, tp=2, pp=2))
    with pytest.raises(col.InvalidArgumentError, match="multiple of tp"):
        example.train(comm, example.Config(tp=4, seq_len=6, sequence_parallel=True))
    with pytest.raises(col.InvalidArgumentError, match="--layers 2, expected at least 3 for 4"):
        example.train(comm, example.Config(pp=4, layers=2))  # stage 2 would hold nothing


def test_hand_written_backward_matches_finite_differences():
    example = load_example()
    with col.init(backend="mpi") as world:
        alone = world.split(world.rank)
        cfg = example.Config(layers=1, hidden=8, heads=2, seq_len=5)
        model = example.GPT(cfg, 16, alone, np)
        rng = np.random.default_rng(1)
        full = example.init_full(cfg, 16)
        model.params = {k: v + 0.1 * rng.standard_normal(v.shape) for k, v in full.items()}
        model.grads = {k: np.zeros_like(v) for k, v in full.items()}
        model.build_layers(full, list(full))
        stage = model.stage(0, 1, split=False)
        ids, target = rng.integers(0, 16, size=(2, 5, 3))

        def loss():
            loss, dlogits = vocab_parallel_cross_entropy(stage.forward(ids, 0), target, alone)
            return float(loss), dlogits

        stage.backward(loss()[1], 0)
        for name, p in model.params.items():
            i = tuple(int(rng.integers(0, s)) for s in p.shape)
            if name == "wte":
                i = (int(ids[0, 0]), *i[1:])  # a row that is looked up
            old, h = p[i], 1e-6
            p[i] = old + h
            up = loss()[0]
            p[i] = old - h
            down = loss()[0]
            p[i] = old
            model.tapes.clear()
            assert model.grads[name][i] == pytest.approx(
                (up - down) / (2 * h), rel=1e-5, abs=1e-8
            ), name
        alone.close()


def test_allreduce_sequence_parallel_grads_sums_in_place(comm, xp):
    a = xp.full((2, 3), float(comm.rank + 1))
    b = xp.arange(4.0) * (comm.rank + 1)
    allreduce_sequence_parallel_grads([a, b], comm)
    total = comm.size * (comm.size + 1) / 2
    assert float(abs(a - total).max()) == 0.0
    assert float(abs(b - xp.arange(4.0) * total).max()) == 0.0


def test_allreduce_sequence_parallel_grads_rejects_mixed_dtypes(comm, xp):
    with pytest.raises(col.InvalidArgumentError, match="mix dtypes"):
        allreduce_sequence_parallel_grads([xp.zeros(2), xp.zeros(2, dtype=xp.float32)], comm)
