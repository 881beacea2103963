"""The direct path (collectives._direct), at world size 1.

This module and test_collectives_fast_path.py run again with ``COLLECTIVES_PURE_PYTHON=1``
(the first test here), so both implementations, compiled and Python, pass them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col
from collectives import _direct


@pytest.fixture
def comm():
    c = col.init(backend="mpi")
    yield c
    c.close()


def test_the_compiled_path_is_in_use_where_it_can_be():
    # Linux, an MPICH-ABI MPI-4 library and a C compiler at install: .ci/run has all three.
    if os.environ.get("COLLECTIVES_PURE_PYTHON") == "1":
        assert not _direct.COMPILED
        assert _direct.request is _direct._py_request
    elif sys.platform == "linux" and MPI.Get_library_version().startswith("MPICH"):
        assert _direct.COMPILED
        assert type(_direct._FAST[0].primitives).__name__ == "PyCapsule"


def test_the_communicator_says_which_path_runs_and_why(comm):
    said = comm.call_path
    assert said in repr(comm)
    if os.environ.get("COLLECTIVES_PURE_PYTHON") == "1":
        assert "in C, the MPI calls through mpi4py (COLLECTIVES_PURE_PYTHON=1)" in said
    elif _direct.COMPILED:
        assert "in C (collectives._fastmpi" in said and " on libmpi" in said
    else:
        assert "through mpi4py (" in said  # and the reason: another ABI, no C extension...


@pytest.mark.skipif(os.environ.get("COLLECTIVES_PURE_PYTHON") == "1", reason="in Python now")
def test_these_tests_pass_with_the_python_implementation():
    here = Path(__file__)
    files = [str(here), str(here.with_name("test_collectives_fast_path.py"))]
    env = dict(os.environ, COLLECTIVES_PURE_PYTHON="1")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=here.parent.parent,
    )
    assert run.returncode == 0, run.stdout[-4000:]


# The same calls through the direct path on either primitives, C (_fastmpi.c) or mpi4py
# (_direct._py_post, _py_poll), then the books they leave: they must agree.
_BOOKS_AFTER_CALLS = """
import contextlib, ctypes, json, sys
import numpy as np
from mpi4py import MPI
import collectives as col
from collectives import _direct


@contextlib.contextmanager
def failing_polls(books):
    # MPI_Test returns an error: in C through a test function that does, in Python through
    # a request whose Test raises
    if _direct.COMPILED:
        module, addresses = _direct._FAST
        fail = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
            lambda request, done, status: MPI.ERR_OTHER
        )
        test = _direct._CALLS[_direct._abi()].index("MPI_Test")
        failing = list(addresses)
        failing[test] = ctypes.cast(fail, ctypes.c_void_p).value
        _direct.set_up(module, failing)
        try:
            yield
        finally:
            _direct.set_up(module, addresses)
        return

    class Failing:  # once, as the C test function fails while it is set up
        def __init__(self, request):
            self.request = request
            self.failed = False

        def Test(self):
            if self.failed:
                return self.request.Test()
            self.failed = True
            raise MPI.Exception(MPI.ERR_OTHER)

    comm_handle = books.handle

    class Posting:
        def Iallreduce(self, *args):
            return Failing(comm_handle.Iallreduce(*args))

    books.handle = Posting()
    try:
        yield
    finally:
        books.handle = comm_handle


with col.init(backend="mpi", check=True, mpi_blocking=sys.argv[1] == "1") as comm:
    books = comm._books
    x = np.arange(4.0)
    comm.all_reduce(x)
    comm.all_reduce(x, "max", out=np.empty_like(x))
    comm.broadcast(x)
    comm.all_reduce(x, "avg")  # the general path
    comm.all_reduce(np.ones((2, 3), np.int32))
    comm.all_gather(x)
    comm.reduce(x, 0, "min")
    comm.all_reduce(x, async_op=True).wait()
    work = comm.all_gather(x, async_op=True)  # waited for after a later call
    comm.broadcast(x)
    work.wait()
    # MPI errors straight from the direct path (the communicator's mpi_error would turn them
    # into a CollectivesError and declare itself dead)
    def raise_it(call, error):
        raise error

    books.mpi_error = raise_it
    handle, books.handle = books.handle, _direct.handle(MPI.COMM_NULL)
    try:
        _direct.broadcast(books, x, 0)
    except MPI.Exception:
        pass
    books.handle = handle
    with failing_polls(books):
        if not books.blocking:  # blocking calls are not polled
            try:
                _direct.all_reduce(books, x, "sum", None)
            except MPI.Exception:
                pass
        work = _direct.all_reduce(books, x, "sum", None, True)
        try:
            work.wait()
        except MPI.Exception:
            pass
        assert not books.in_flight  # handed to the backend, which keeps its arrays
    comm.barrier()
    record = [[c[k] for k in ("seq", "call", "shape", "dtype", "state")] for c in comm.flight_record()]
    print(json.dumps([books.seq, books.p2p, books.slots[books.slot], books.busy, record]))
"""


@pytest.mark.skipif(not _direct.COMPILED, reason="only the Python direct path is built here")
@pytest.mark.parametrize("blocking", ["0", "1"])
def test_the_c_and_python_direct_paths_keep_the_same_books(blocking):
    said = []
    for pure in ("0", "1"):
        env = dict(os.environ, COLLECTIVES_PURE_PYTHON=pure)
        run = subprocess.run(
            [sys.executable, "-c", _BOOKS_AFTER_CALLS, blocking],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert run.returncode == 0, run.stderr[-4000:]
        said.append(run.stdout)
    assert said[0] == said[1]
    seq, p2p, board, busy, record = json.loads(said[0])
    polled = blocking == "0"
    assert (seq, p2p, board, busy) == (13 + polled, 0, 13 + polled, False)
    # 11, the broadcast that failed to post, is not in flight; 12 (polled only) and the
    # async all_reduce after it, whose polls failed, were posted: they stay, never completed
    expected = [(1, "all_reduce"), (2, "all_reduce"), (3, "broadcast"), (4, "all_reduce")]
    expected += [(5, "all_reduce"), (6, "all_gather"), (7, "reduce"), (8, "all_reduce")]
    expected += [(9, "all_gather"), (10, "broadcast")]
    expected += [(12, "all_reduce")] * polled + [(12 + polled, "all_reduce")]
    expected += [(13 + polled, "barrier")]
    assert [tuple(entry[:2]) for entry in record] == expected
    assert [entry[4] for entry in record].count("started") == 1 + polled


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int8, np.uint64])
def test_all_reduce_in_place_and_out_of_place(comm, dtype):
    x = np.arange(1, 6, dtype=dtype).reshape(5, 1)
    assert _direct.all_reduce(comm._books, x, "max", None) is x
    out = np.zeros_like(x)
    assert _direct.all_reduce(comm._books, x, col.ReduceOp.SUM, out) is out
    np.testing.assert_array_equal(out, x)
    record = comm.flight_record()
    assert [(c["seq"], c["call"]) for c in record] == [(1, "all_reduce"), (2, "all_reduce")]
    assert comm.progress_report() == "Every rank on this node has reached collective #2."


def test_broadcast_and_an_empty_array(comm):
    x = np.arange(4.0)
    x.flags.writeable = False  # the root only reads its buffer
    assert _direct.broadcast(comm._books, x, 0) is x
    empty = np.ones(0)
    assert _direct.broadcast(comm._books, empty, 0) is empty
    assert [c["state"] for c in comm.flight_record()] == ["completed", "completed"]


@pytest.mark.parametrize("async_op", [False, True])
def test_reduce_scatter_in_place_writes_only_this_ranks_slot(comm, async_op):
    # MPI's in-place form writes x[0]: the direct path reduces into a new array and copies
    # it to x[rank] once complete
    x = np.arange(6.0).reshape(1, 6)
    before = x.copy()
    result = _direct.reduce_scatter(comm._books, x, "max", x[0], async_op)
    assert result is not NotImplemented
    if async_op:
        assert isinstance(result, col.Work)
        result = result.wait()
    np.testing.assert_array_equal(result, before[0])
    np.testing.assert_array_equal(x, before)
    assert [type(c).__name__ for c in comm.recorder] == ["Entry"]  # nothing else recorded it
    slot = x[0]
    with comm.group():  # complete, and copied, once the group ends
        held = _direct.reduce_scatter(comm._books, x + 1, "max", slot, async_op)
        assert held is not NotImplemented
    assert (held.wait() if async_op else held) is slot
    np.testing.assert_array_equal(x[0], before[0] + 1)


def _not_for_the_direct_path():
    strided = np.zeros(8)[::2]
    read_only = np.ones(4)
    read_only.flags.writeable = False
    buf = np.arange(8.0)
    return [
        ("list", [1.0, 2.0], "sum", None),
        ("subclass", np.ones(4).view(np.matrix), "sum", None),
        ("strided", strided, "sum", None),
        ("read-only in place", read_only, "sum", None),
        ("complex", np.ones(4, np.complex64), "sum", None),
        ("big-endian", np.ones(4, ">f8"), "sum", None),
        ("avg", np.ones(4), "avg", None),
        ("op name unknown", np.ones(4), "mean", None),
        ("op a list", np.ones(4), ["sum"], None),
        ("op an int", np.ones(4), 0, None),
        ("out of another dtype", np.ones(4), "sum", np.ones(4, np.float32)),
        ("out of another shape", np.ones(4), "sum", np.ones((2, 2))),
        ("out strided", np.ones(4), "sum", strided),
        ("out read-only", np.ones(4), "sum", read_only),
        ("out a list", np.ones(4), "sum", [0.0] * 4),
        ("out overlapping", buf[0:4], "sum", buf[2:6]),
        ("out the same memory", buf[0:4], "sum", buf[0:4]),
    ]


@pytest.mark.parametrize(
    "x, op, out",
    [case[1:] for case in _not_for_the_direct_path()],
    ids=[case[0] for case in _not_for_the_direct_path()],
)
def test_what_is_left_to_the_general_path_is_left_untouched(comm, x, op, out):
    assert _direct.all_reduce(comm._books, x, op, out) is NotImplemented
    _nothing_was_numbered(comm)


@pytest.mark.parametrize("root", [1, -1, 2**70, 0.0, True, None])
def test_broadcast_leaves_bad_roots_to_the_general_path(comm, root):
    assert _direct.broadcast(comm._books, np.ones(2), root) is NotImplemented
    _nothing_was_numbered(comm)


def test_each_call_takes_its_own_dtype_and_shape_whatever_came_before(comm):
    # the verbs keep the last dtype's entry of the table, and record the shape from the
    # buffer they hold: every call in a mixed sequence must still record and reduce its own
    calls = [np.ones((2, 3)), np.ones(4, ">f8"), np.ones(5, np.float32), np.ones((1, 2, 2), "<f8")]
    calls += [np.ones(3, np.int8), np.ones(3, np.float32).view(np.int32)]
    for x in calls:
        got = _direct.all_reduce(comm._books, x.copy(), "sum", None)
        if x.dtype.byteorder == ">":
            assert got is NotImplemented  # the general path's
        else:
            assert got.dtype == x.dtype and (got == x).all()
    native = [x for x in calls if x.dtype.byteorder != ">"]
    record = [(c["shape"], c["dtype"]) for c in comm.flight_record()]
    assert record == [(x.shape, x.dtype.name) for x in native]


def _nothing_was_numbered(comm):
    assert comm.flight_record() == []
    comm.barrier()
    assert [c["seq"] for c in comm.flight_record()] == [1]


def test_a_thread_holding_the_communicator_leaves_the_call_to_the_general_path(comm):
    books = comm._books
    books.take("test")  # as while another thread's call is in flight
    try:
        assert _direct.all_reduce(books, np.ones(2), "sum", None) is NotImplemented
        with pytest.raises(col.CommunicatorStateError, match="in use by another thread"):
            comm.all_reduce(np.ones(2))
    finally:
        books.give()


def test_a_failed_post_is_raised_unrecorded_and_the_token_comes_back(comm):
    books = comm._books

    def raise_it(call, error):  # as given, not the communicator's death it would be
        raise error

    handle, books.handle = books.handle, _direct.handle(MPI.COMM_NULL)
    mpi_error, books.mpi_error = books.mpi_error, raise_it
    try:
        with pytest.raises(MPI.Exception):
            _direct.all_reduce(books, np.ones(2), "sum", None)
    finally:
        books.handle, books.mpi_error = handle, mpi_error
    assert comm.flight_record() == []
    assert not books.busy
    np.testing.assert_array_equal(comm.all_reduce(np.ones(2)), 1.0)


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc/self/maps")
def test_cuda_awareness_is_asked_of_the_library_mpi4py_loaded(monkeypatch):
    import ctypes

    from collectives._mpi import library_path, mpi_cuda_aware

    path = library_path()
    assert path is not None and "libmpi" in os.path.basename(path)
    monkeypatch.delenv("COLLECTIVES_MPI_CUDA_AWARE", raising=False)
    if MPI.Get_library_version().startswith("MPICH"):  # MPICH has the query, Open MPI too
        query = ctypes.CDLL(path).MPIX_Query_cuda_support
        assert mpi_cuda_aware() is bool(query())
    monkeypatch.setenv("COLLECTIVES_MPI_CUDA_AWARE", "1")
    assert mpi_cuda_aware() is True


def test_blocking_calls_are_chosen_by_argument_then_environment_then_library(monkeypatch):
    from collectives import _mpi

    with pytest.raises(col.InvalidArgumentError, match="mpi_blocking must be True, False"):
        col.init(backend="mpi", mpi_blocking="yes")
    for told, expected in (("1", True), ("0", False)):
        monkeypatch.setenv("COLLECTIVES_MPI_BLOCKING", told)
        assert _mpi.blocking_by_default() is expected
        with col.init(backend="mpi", mpi_blocking=not expected) as c:
            assert c._impl.blocking is (not expected)  # the argument wins
    monkeypatch.delenv("COLLECTIVES_MPI_BLOCKING")
    assert _mpi.blocking_by_default() is (MPI.get_vendor()[0] in ("Open MPI", "Intel MPI"))


def test_kept_calls_are_chosen_by_environment_then_library_unless_told_non_blocking(monkeypatch):
    from collectives import _mpi_base

    vendor = MPI.get_vendor()[0]
    expected = {"MPICH": 1024, "Open MPI": 0}.get(vendor, 0)
    monkeypatch.delenv("COLLECTIVES_MPI_PERSISTENT", raising=False)
    monkeypatch.delenv("COLLECTIVES_MPI_BLOCKING", raising=False)
    assert _mpi_base.kept_bytes(None) == _mpi_base.kept_bytes(True) == expected
    assert _mpi_base.kept_bytes(False) == 0  # ranks may mix the forms of a call there
    monkeypatch.setenv("COLLECTIVES_MPI_BLOCKING", "0")
    assert _mpi_base.kept_bytes(None) == 0 and _mpi_base.kept_bytes(True) == expected
    monkeypatch.setenv("COLLECTIVES_MPI_BLOCKING", "1")
    assert _mpi_base.kept_bytes(None) == expected and _mpi_base.kept_bytes(False) == 0
    monkeypatch.delenv("COLLECTIVES_MPI_BLOCKING")
    monkeypatch.setenv("COLLECTIVES_MPI_PERSISTENT", "512")
    assert _mpi_base.kept_bytes(None) == (512 if vendor in ("MPICH", "Open MPI") else 0)
    for blocking in (True, None, False):
        with col.init(backend="mpi", mpi_blocking=blocking) as c:
            kept = 512 if blocking is not False and vendor in ("MPICH", "Open MPI") else 0
            assert c._books.kept_bytes == kept
            assert ("kept persistent requests" in c.call_path) is (kept > 0 and _direct.COMPILED)
            with c.split(0) as child:  # a child keeps calls as its parent does
                assert child._books.kept_bytes == kept
            # MPICH's in-place form is its faster one; every rank makes it alike
            assert c._books.kept_all_to_all_in_place is (vendor == "MPICH")
            x = np.arange(64.0)  # kept (512 bytes), then not (1 KiB)
            assert c.all_reduce(x) is x and c.all_reduce(np.ones(128))[0] == c.size
            np.testing.assert_array_equal(x, np.arange(64.0) * c.size)


@pytest.mark.parametrize("call", ["all_reduce", "broadcast", "barrier"])
def test_an_mpi_error_is_a_collectives_error_naming_the_call_and_the_communicator_dies(call):
    comm = col.init(backend="mpi", mpi_blocking=False)
    real, comm._books.handle = comm._books.handle, _direct.handle(MPI.COMM_NULL)
    good = comm._impl.comm
    comm._impl.comm = MPI.COMM_NULL  # the general path's calls fail in MPI too
    try:
        with pytest.raises(col.CollectivesError) as info:
            getattr(comm, call)(*([] if call == "barrier" else [np.ones(2)]))
    finally:
        comm._books.handle, comm._impl.comm = real, good
    error = info.value
    assert not isinstance(error, MPI.Exception) and isinstance(error.__cause__, MPI.Exception)
    message = str(error)
    assert message.startswith(f"{call}: MPI error ") and "on rank 0" in message, message
    assert "the communicator is unusable" in message
    with pytest.raises(col.CommunicatorStateError, match="unusable after an earlier error"):
        comm.all_reduce(np.ones(2))
    comm.close()


def test_the_board_names_every_blocking_call_by_its_kind():
    from collectives._progress import BLOCKING_CALLS

    point_to_point = ("send", "recv")  # never blocking: a rank may send before it receives
    kinds = {code + 1: name for code, name in enumerate(_direct.KINDS)}
    assert BLOCKING_CALLS == {c: n for c, n in kinds.items() if n not in point_to_point}
    assert max(BLOCKING_CALLS) < 16  # the code's 4 bits of an inside word


def test_check_mode_in_a_world_of_one_splits_and_runs_both_forms():
    # a world of one has no channel for failure notices: split's arrival goes over the
    # communicator itself (it was MPI_COMM_NULL, an MPI error)
    with col.init(backend="mpi", check=True) as comm:
        with comm.split(0) as child:
            assert child.all_reduce(np.ones(2)).tolist() == [1.0, 1.0]
        assert comm.all_reduce(np.ones(2), async_op=True).wait().tolist() == [1.0, 1.0]
