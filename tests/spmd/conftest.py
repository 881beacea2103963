"""Runs inside every rank of an ``mpiexec -n N python -m pytest tests/spmd/...`` job.

Each test gets a fresh communicator (so one that timed out cannot poison the next test),
the ranks meet at a barrier after every test (so a test that failed early on one rank does
not leave the others one collective behind), and this rank's outcomes are written to
``$SPMD_REPORT_DIR/rank<r>.json`` for the launcher in ``tests/spmd_launcher.py``.

``COLLECTIVES_TEST_BACKEND`` picks what every test runs on:

- ``mpi`` (the default): the MPI backend on NumPy arrays;
- ``mpi-cupy``: the MPI backend on CuPy arrays (staged through host memory);
- ``nccl``: the NCCL backend on CuPy arrays.

Tests take the communicator from the ``comm`` fixture, the array module from ``xp`` and, when
they call ``col.init`` themselves, the backend name from ``backend``. Under a CuPy backend
where CuPy cannot run (no GPU, no NCCL, more ranks than NCCL allows on the GPUs) these
fixtures skip with the reason. Tests about NumPy on MPI alone (the direct path, host-only
errors) are marked ``numpy_only`` and skip under the CuPy backends.
"""

from __future__ import annotations

import functools
import json
import os
import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col

WORLD = MPI.COMM_WORLD
_SYNC = WORLD.Dup()
_OUTCOMES: list[dict] = []
COMM_TIMEOUT = float(os.environ.get("SPMD_COMM_TIMEOUT", "30"))

TEST_BACKENDS = ("mpi", "mpi-cupy", "nccl")
TEST_BACKEND = os.environ.get("COLLECTIVES_TEST_BACKEND", "mpi")
if TEST_BACKEND not in TEST_BACKENDS:
    raise pytest.UsageError(
        f"COLLECTIVES_TEST_BACKEND must be one of {', '.join(TEST_BACKENDS)}, got {TEST_BACKEND!r}"
    )
BACKEND = "nccl" if TEST_BACKEND == "nccl" else "mpi"  # what col.init is given
CUPY = TEST_BACKEND != "mpi"  # whether the tests' arrays are CuPy arrays


def _local_size() -> int:
    """Ranks on this node (collective: every rank calls it, at import)."""
    local = WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    size = local.Get_size()
    local.Free()
    return size


LOCAL_SIZE = _local_size()


@functools.cache
def nccl_unusable_reason() -> str | None:
    """Why this job's ranks cannot run NCCL here: no GPU or NCCL, or more ranks per GPU than
    NCCL allows (two need NCCL >= 2.30.3 with NCCL_MULTI_RANK_GPU_ENABLE=1); None when they can."""
    from collectives._nccl import nccl_unavailable_reason

    reason = nccl_unavailable_reason()
    if reason is not None:
        return reason
    import cupy
    from cupy.cuda import nccl

    ranks_per_gpu = -(-LOCAL_SIZE // cupy.cuda.runtime.getDeviceCount())
    shared = nccl.get_version() >= 23003 and os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE") == "1"
    if ranks_per_gpu > 2 or (ranks_per_gpu == 2 and not shared):
        return (
            f"{ranks_per_gpu} ranks per GPU need NCCL >= 2.30.3 with "
            "NCCL_MULTI_RANK_GPU_ENABLE=1 (at most 2 per GPU)"
        )
    return None


def _cupy_unusable_reason() -> str | None:
    """Why this job cannot run TEST_BACKEND here; None when it can (or it needs no CuPy)."""
    if not CUPY:
        return None
    where = f"COLLECTIVES_TEST_BACKEND={TEST_BACKEND}"
    try:
        import cupy
    except Exception as e:  # ImportError, or a CUDA library that fails to load
        return f"{where}: CuPy is not importable ({type(e).__name__})"
    try:
        gpus = cupy.cuda.runtime.getDeviceCount()
    except Exception:
        gpus = 0
    if gpus < 1:
        return f"{where}: no CUDA device"
    reason = nccl_unusable_reason() if TEST_BACKEND == "nccl" else None
    return None if reason is None else f"{where}: {reason}"


UNUSABLE = _cupy_unusable_reason()


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "numpy_only(reason): a test of NumPy arrays on the MPI backend; skipped under "
        "COLLECTIVES_TEST_BACKEND=mpi-cupy and nccl",
    )


def pytest_collection_modifyitems(config, items):
    if not CUPY:
        return
    for item in items:
        marker = item.get_closest_marker("numpy_only")
        if marker is not None:
            why = marker.kwargs.get("reason") or (marker.args[0] if marker.args else "")
            item.add_marker(pytest.mark.skip(reason=f"NumPy on MPI only: {why}"))


def array_module():
    """NumPy, or CuPy under the CuPy backends (skips the test where CuPy cannot run)."""
    if not CUPY:
        return np
    if UNUSABLE is not None:
        pytest.skip(UNUSABLE)
    import cupy

    return cupy


@pytest.fixture
def backend() -> str:
    """The backend name to give ``col.init`` (skips the test where it cannot run here)."""
    array_module()
    return BACKEND


@pytest.fixture
def nccl_world() -> None:
    """Skips the test where this job's ranks cannot run the NCCL backend here."""
    reason = nccl_unusable_reason()
    if reason is not None:
        pytest.skip(f"NCCL backend: {reason}")


@pytest.fixture
def xp():
    """The array module of the backend under test: NumPy on ``mpi``, else CuPy."""
    return array_module()


@pytest.fixture
def comm(backend):
    """A fresh communicator over the whole world, closed after the test."""
    c = col.init(backend=backend, timeout=COMM_TIMEOUT)
    yield c
    c.close()


@pytest.fixture(autouse=True)
def _resync_ranks():
    yield
    request = _SYNC.Ibarrier()
    deadline = time.monotonic() + COMM_TIMEOUT + 10
    while not request.Test():
        if time.monotonic() > deadline:
            pytest.fail(f"rank {WORLD.rank}: other ranks did not finish this test in time")
        time.sleep(1e-4)


def pytest_runtest_logreport(report):
    if report.when != "call" and report.outcome == "passed":
        return
    if report.skipped and isinstance(report.longrepr, tuple):
        detail = report.longrepr[2]
    else:
        detail = str(report.longrepr) if report.longrepr else ""
    _OUTCOMES.append(
        {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome, "detail": detail}
    )


def pytest_sessionfinish(session, exitstatus):
    folder = os.environ.get("SPMD_REPORT_DIR")
    if folder:
        path = os.path.join(folder, f"rank{WORLD.rank}.json")
        with open(path, "w") as f:
            json.dump({"rank": WORLD.rank, "size": WORLD.size, "outcomes": _OUTCOMES}, f)
