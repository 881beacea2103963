"""examples/gpt_3d.py stopped after step 3 and resumed on another mesh (another ZeRO stage or
plain DDP, another dp x tp x pp) prints the losses of a run that never stopped: steps 4-6,
float64, within 1e-12 relative. The 8-rank meshes were run by hand (docs/checkpoint.md)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from mpi4py import MPI

from tests.spmd.test_gpt_3d import load_example

WORLD_SIZES = (2, 4)
SMALL = dict(layers=4, hidden=16, heads=4, seq_len=8, global_batch=16)

# (dp, tp, pp, schedule, zero, sequence parallel): saved on the first, resumed on the second
PAIRS = {
    2: [
        ((2, 1, 1, "1f1b", 2, False), (1, 1, 2, "1f1b", 0, False)),
        ((1, 2, 1, "1f1b", 0, True), (2, 1, 1, "gpipe", 1, False)),
    ],
    4: [
        ((2, 2, 1, "1f1b", 2, True), (1, 2, 2, "interleaved", 0, False)),
        ((2, 1, 2, "zero_bubble", 1, False), (4, 1, 1, "1f1b", 2, False)),
    ],
}


def config(example, mesh, **more):
    dp, tp, pp, schedule, zero, sp = mesh
    return example.Config(
        dp=dp, tp=tp, pp=pp, schedule=schedule, zero=zero, sequence_parallel=sp, **SMALL, **more
    )


@pytest.mark.numpy_only(reason="the example's arrays are NumPy here")
@pytest.mark.parametrize("pair", [0, 1])
def test_resumed_on_another_mesh_equals_never_stopping(comm, pair):
    example = load_example()
    first, second = PAIRS[comm.size][pair]
    world = MPI.COMM_WORLD
    directory = Path(world.bcast(tempfile.mkdtemp(prefix="gpt-") if world.rank == 0 else None))
    try:
        straight = example.train(comm, config(example, first, steps=6))
        stopped = example.train(
            comm, config(example, first, steps=3, save=str(directory), save_every=3)
        )
        assert stopped == straight[:3]
        resumed = example.train(comm, config(example, second, steps=6, resume=str(directory)))
        assert resumed == pytest.approx(straight[3:], rel=1e-12)
    finally:
        world.Barrier()
        if world.rank == 0:
            shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.numpy_only(reason="bf16 runs on ml_dtypes' NumPy bfloat16")
def test_resumed_in_another_precision_follows_float32(comm):
    """fp32 saved on one mesh, resumed in bf16 on another, and back: each resumed run
    follows the float32 run that never stopped (within 2%, the precision test's bound); the
    masters' exactness is tests/test_checkpoint.py's."""
    if comm.size != 2:
        pytest.skip("one world size shows it (the meshes are the other test's)")
    example = load_example()
    first, second = PAIRS[comm.size][0]
    world = MPI.COMM_WORLD
    directory = Path(world.bcast(tempfile.mkdtemp(prefix="gpt-") if world.rank == 0 else None))
    try:
        fp32 = dict(precision="fp32")
        straight = example.train(comm, config(example, first, steps=6, **fp32))
        example.train(
            comm, config(example, first, steps=3, save=str(directory / "a"), save_every=3, **fp32)
        )
        half = example.train(
            comm,
            config(
                example,
                second,
                steps=6,
                resume=str(directory / "a"),
                precision="bf16",
                save=str(directory / "b"),
                save_every=5,
            ),
        )
        assert half == pytest.approx(straight[3:], rel=0.02)
        back = example.train(
            comm, config(example, first, steps=6, resume=str(directory / "b"), **fp32)
        )
        assert back == pytest.approx(straight[5:], rel=0.02)
    finally:
        world.Barrier()
        if world.rank == 0:
            shutil.rmtree(directory, ignore_errors=True)
