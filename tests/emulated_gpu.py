"""Switching the tests onto the emulated CuPy (tests/emulation) where no real CuPy is.

``COLLECTIVES_TEST_EMULATED_GPUS=N`` (N emulated GPUs per node) puts ``tests/emulation``
first on this process's import path and on ``PYTHONPATH`` for every process it starts, so
that ``import cupy`` in every rank finds the emulation. Where a real CuPy is installed the
switch is refused: the emulation never stands in for a GPU that is there.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path

EMULATION_DIR = Path(__file__).resolve().parent / "emulation"
SWITCH = "COLLECTIVES_TEST_EMULATED_GPUS"


def real_cupy() -> str | None:
    """Where a real CuPy is installed (outside the emulation), or None."""
    path = [p for p in sys.path if Path(p or ".").resolve() != EMULATION_DIR]
    spec = importlib.machinery.PathFinder.find_spec("cupy", path)
    return None if spec is None else str(spec.origin)


def emulated_gpus() -> int:
    """How many emulated GPUs each node has (0: the emulation is off)."""
    return int(os.environ.get(SWITCH, "0") or 0)


def switch_on() -> None:
    """Make this process and its children import the emulated CuPy, if asked to."""
    gpus = emulated_gpus()
    if not gpus:
        return
    found = real_cupy()
    if found is not None:
        raise RuntimeError(
            f"{SWITCH}={gpus}, but a real CuPy is installed ({found}): the emulation never "
            f"stands in for it; unset {SWITCH}"
        )
    if str(EMULATION_DIR) not in sys.path:
        sys.path.insert(0, str(EMULATION_DIR))
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(EMULATION_DIR) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(EMULATION_DIR), *paths])
    os.environ["EMULATED_CUPY_DEVICES"] = str(gpus)


def nccl_job_env(gpus: int = 2) -> dict[str, str]:
    """The environment for a job of a test's own on the NCCL backend: the real CuPy where
    one is installed (two ranks may then share its GPU), else the emulation with ``gpus``
    GPUs per node."""
    if real_cupy() is not None:
        return {"NCCL_MULTI_RANK_GPU_ENABLE": "1"}
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(EMULATION_DIR) not in paths:
        paths.insert(0, str(EMULATION_DIR))
    return {"PYTHONPATH": os.pathsep.join(paths), "EMULATED_CUPY_DEVICES": str(gpus)}
