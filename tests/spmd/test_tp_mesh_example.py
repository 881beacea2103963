"""examples/tp_mesh.py: dp x tp training prints the losses of the unsharded model."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

WORLD_SIZES = (1, 2, 4)
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tp_mesh.py"


def load_example():
    spec = importlib.util.spec_from_file_location("tp_mesh_example", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_docstring_starts_with_the_launch_command():
    assert load_example().__doc__.splitlines()[0] == "mpiexec -n 4 python examples/tp_mesh.py"


def test_losses_equal_unsharded_training(comm):
    example = load_example()
    losses, reference = example.train(comm, steps=6)
    assert len(losses) == len(reference) == 6
    assert losses == pytest.approx(reference, rel=1e-12)
    # Full-batch AdamW at this rate: the loss falls every step.
    assert all(b < a for a, b in zip(reference, reference[1:]))
    assert reference[-1] < 0.5 * reference[0]
