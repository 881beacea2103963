"""Runs inside every rank of an ``mpiexec -n N python -m pytest tests/spmd/...`` job.

Each test gets a fresh communicator (so one that timed out cannot poison the next test),
the ranks meet at a barrier after every test (so a test that failed early on one rank does
not leave the others one collective behind), and this rank's outcomes are written to
``$SPMD_REPORT_DIR/rank<r>.json`` for the launcher in ``tests/spmd_launcher.py``.
"""

from __future__ import annotations

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
BACKEND = os.environ.get("COLLECTIVES_TEST_BACKEND", "mpi")


def _gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


HAS_GPU = _gpu_available()


@pytest.fixture
def comm():
    """A fresh communicator over the whole world, closed after the test."""
    c = col.init(backend=BACKEND, timeout=COMM_TIMEOUT)
    yield c
    c.close()


@pytest.fixture(params=["numpy", "cupy"])
def xp(request):
    """The array module under test: NumPy always, CuPy where a GPU is present."""
    if request.param == "numpy":
        return np
    if not HAS_GPU:
        pytest.skip("CuPy arrays need a GPU")
    import cupy

    return cupy


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
