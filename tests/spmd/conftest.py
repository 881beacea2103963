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

import collections
import json
import os
import threading
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


def _nccl_unusable_reason() -> str | None:
    """Why this job's ranks cannot run NCCL here, by the library's own rule (the one
    ``init`` applies), or None when they can. Collective: every rank calls it, at import."""
    from collectives._nccl import choose_device, nccl_unavailable_reason, placement
    from collectives._nccl_rules import shared_gpu_reason

    local = WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank = local.Get_rank()
    local.Free()
    found: tuple | str | None = nccl_unavailable_reason()
    if found is None:
        try:
            found = placement(choose_device(None, local_rank))
        except Exception as e:
            found = f"{type(e).__name__}: {e}"
    everyone = WORLD.allgather(found)
    problems = [f for f in everyone if isinstance(f, str)]
    if problems:
        return problems[0]
    why = shared_gpu_reason([f[:4] for f in everyone], min(f[4] for f in everyone))
    if why is not None:
        return why
    per_gpu = max(collections.Counter(f[:2] for f in everyone).values())
    if per_gpu > 2:  # NCCL's multi-rank mode is documented for two ranks per GPU
        return f"{per_gpu} ranks on one GPU; NCCL's multi-rank mode takes at most 2"
    return None


NCCL_UNUSABLE = _nccl_unusable_reason()


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
    reason = NCCL_UNUSABLE if TEST_BACKEND == "nccl" else None
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
    if NCCL_UNUSABLE is not None:
        pytest.skip(f"NCCL backend: {NCCL_UNUSABLE}")


@pytest.fixture
def xp():
    """The array module of the backend under test: NumPy on ``mpi``, else CuPy."""
    return array_module()


#: ``COLLECTIVES_TEST_REUSE_COMM=1``: in the modules that declare ``SHARED_COMM = True`` (their
#: tests look at no communicator's history), one communicator over the world serves every test
#: while it stays usable (the GPU run: NCCL's initialisation is the suite's largest cost there)
REUSE_COMM = os.environ.get("COLLECTIVES_TEST_REUSE_COMM") == "1"
_SHARED: dict[str, col.Communicator] = {}


def _reusable(c: col.Communicator | None) -> bool:
    """Whether every rank can go on with ``c`` (decided together: a rank that made a new
    communicator while another reused its old one would hang both)."""
    usable = c is not None and c.owner is threading.current_thread()
    if usable:
        try:
            c.ensure_usable("reuse")
        except col.CollectivesError:
            usable = False
    return bool(_SYNC.allreduce(usable, op=MPI.LAND))


@pytest.fixture
def comm(backend, request):
    """A fresh communicator over the whole world, closed after the test (with
    ``COLLECTIVES_TEST_REUSE_COMM=1``, in a module that allows it: the shared one while it
    stays usable)."""
    if REUSE_COMM and getattr(request.module, "SHARED_COMM", False):
        shared = _SHARED.get(backend)
        if not _reusable(shared):
            if shared is not None:
                shared.abort()
            shared = _SHARED[backend] = col.init(backend=backend, timeout=COMM_TIMEOUT)
        yield shared
        return
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
    for shared in _SHARED.values():
        shared.close()
    folder = os.environ.get("SPMD_REPORT_DIR")
    if folder:
        path = os.path.join(folder, f"rank{WORLD.rank}.json")
        with open(path, "w") as f:
            json.dump({"rank": WORLD.rank, "size": WORLD.size, "outcomes": _OUTCOMES}, f)
