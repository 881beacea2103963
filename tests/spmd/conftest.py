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
fixtures skip with the reason. Tests about NumPy on MPI alone (the MPI backend's own settings,
host-only errors) are marked ``numpy_only`` and skip under the CuPy backends.
"""

from __future__ import annotations

import collections
import json
import os
import socket
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


def _ranks_per_gpu() -> int:
    """The most ranks of this job on one GPU where ``init`` puts them by default (local rank
    modulo the GPUs a rank sees), told apart by host and PCI bus id; 1 where CuPy cannot say.
    Collective: every rank calls it."""
    local = WORLD.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank = local.Get_rank()
    local.Free()
    found: tuple | None = None
    try:
        import cupy

        device = local_rank % cupy.cuda.runtime.getDeviceCount()
        found = (socket.gethostname(), cupy.cuda.Device(device).pci_bus_id)
    except Exception:  # no CuPy, no device: init says why
        pass
    placed = [f for f in WORLD.allgather(found) if f is not None]
    return max(collections.Counter(placed).values(), default=1)


def _nccl_unusable_reason() -> str | None:
    """Why this job's ranks cannot run NCCL here, or None when they can: what
    ``col.init("nccl")`` says where it refuses (no GPU, no NCCL, ranks on a GPU their NCCL
    cannot share), and more than two ranks on one GPU, which NCCL's multi-rank mode is not
    documented for (so init is not tried). Collective: every rank calls it, once (see
    :func:`nccl_unusable`)."""
    per_gpu = _ranks_per_gpu()
    if per_gpu > 2:
        return f"{per_gpu} ranks on one GPU; NCCL's multi-rank mode takes at most 2"
    try:
        probe = col.init(backend="nccl", timeout=COMM_TIMEOUT)
    except col.CollectivesError as e:
        return str(e)
    probe.close()
    return None


_NCCL_UNUSABLE: list[str | None] = []


def nccl_unusable() -> str | None:
    """:func:`_nccl_unusable_reason`, asked once, when a test first needs NCCL (on every rank
    alike: the ranks run the same tests and fixtures)."""
    if not _NCCL_UNUSABLE:
        _NCCL_UNUSABLE.append(_nccl_unusable_reason())
    return _NCCL_UNUSABLE[0]


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
    reason = nccl_unusable() if TEST_BACKEND == "nccl" else None
    return None if reason is None else f"{where}: {reason}"


_UNUSABLE: list[str | None] = []


def cupy_unusable() -> str | None:
    """:func:`_cupy_unusable_reason`, asked once, when a test first needs the backend."""
    if not _UNUSABLE:
        _UNUSABLE.append(_cupy_unusable_reason())
    return _UNUSABLE[0]


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
    unusable = cupy_unusable()
    if unusable is not None:
        pytest.skip(unusable)
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
    unusable = nccl_unusable()
    if unusable is not None:
        pytest.skip(f"NCCL backend: {unusable}")


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
