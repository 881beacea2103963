"""The direct path's two implementations (compiled, Python) agree, at world size 1."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from mpi4py import MPI

from collectives import _direct

PYTHON = pytest.param((_direct._all_reduce, _direct._broadcast, lambda obj: obj), id="python")
try:
    from collectives import _fastmpi  # type: ignore[attr-defined]

    COMPILED = pytest.param(
        (_fastmpi.all_reduce, _fastmpi.broadcast, MPI._handleof), id="compiled"
    )
except ImportError:
    COMPILED = pytest.param(None, id="compiled", marks=pytest.mark.skip("_fastmpi not built"))


def test_the_compiled_path_is_in_use_where_it_can_be():
    # Linux, an MPICH-ABI MPI-4 library and a C compiler at install: .ci/run has all three.
    if os.environ.get("COLLECTIVES_PURE_PYTHON") != "1" and sys.platform == "linux":
        if MPI.Get_library_version().startswith("MPICH"):
            assert _direct.COMPILED
            assert _direct.all_reduce is _fastmpi.all_reduce


def test_the_python_path_can_be_chosen():
    code = "from collectives import _direct; assert not _direct.COMPILED, 'compiled'"
    env = dict(os.environ, COLLECTIVES_PURE_PYTHON="1")
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=60)


@pytest.fixture(params=[COMPILED, PYTHON])
def impl(request):
    all_reduce, broadcast, handle = request.param
    comm = MPI.COMM_WORLD.Dup()  # a duplicate: its handle has the high bit set
    yield all_reduce, broadcast, handle, comm
    comm.Free()


@pytest.mark.parametrize(
    "dtype, mpi_type",
    [(np.float64, MPI.DOUBLE), (np.float32, MPI.FLOAT), (np.int8, MPI.INT8_T),
     (np.uint64, MPI.UINT64_T)],
)
def test_all_reduce_in_place_and_out_of_place(impl, dtype, mpi_type):
    all_reduce, _, handle, comm = impl
    x = np.arange(1, 6, dtype=dtype).reshape(5, 1)
    assert all_reduce(handle(comm), None, x, handle(mpi_type), handle(MPI.MAX), 1e-2) is None
    np.testing.assert_array_equal(x.ravel(), np.arange(1, 6))
    out = np.zeros_like(x)
    assert all_reduce(handle(comm), x, out, handle(mpi_type), handle(MPI.SUM), 1e-2) is None
    np.testing.assert_array_equal(out, x)


def test_broadcast_and_an_empty_array(impl):
    _, broadcast, handle, comm = impl
    x = np.arange(4.0)
    x.flags.writeable = False  # the root only reads its buffer
    assert broadcast(handle(comm), x, handle(MPI.DOUBLE), 0, 1e-2) is None
    np.testing.assert_array_equal(x, np.arange(4.0))
    assert broadcast(handle(comm), np.ones(0), handle(MPI.DOUBLE), 0, 1e-2) is None


def test_an_mpi_error_is_raised_as_mpi4py_raises_it(impl):
    _, broadcast, handle, comm = impl
    with pytest.raises(MPI.Exception, match="Invalid root"):
        broadcast(handle(comm), np.ones(2), handle(MPI.DOUBLE), 3, 1e-2)


def test_a_buffer_that_cannot_be_written_is_refused(impl):
    all_reduce, _, handle, comm = impl
    x = np.ones(2)
    x.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        all_reduce(handle(comm), None, x, handle(MPI.DOUBLE), handle(MPI.SUM), 1e-2)
