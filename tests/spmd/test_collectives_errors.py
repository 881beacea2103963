"""Every bad input the contract names fails locally, before any communication, with a clear error.

Each case checks that the error is an ``InvalidArgumentError`` (also a ``ValueError``) whose
message names the call, the argument, what was expected and what was given; then the test
runs a real collective to show that the failed call left the ranks in step.
Also: a collective that times out (threads: test_ownership.py).
Arrays are of the backend under test (``xp``); read-only arrays exist only in NumPy.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

import collectives as col
from tests.short_timeout import init_with_short_timeout, warm_up_counts

SHARED_COMM = True  # COLLECTIVES_TEST_REUSE_COMM=1 may give every test one communicator

WORLD_SIZES = (1, 2)
SPMD_TIMEOUT = 240


class Caught:
    message = ""


@contextmanager
def fails(call: str, *fragments: str, error_type=col.InvalidArgumentError) -> Iterator[Caught]:
    """The block must raise ``error_type`` starting with ``call:`` and naming ``fragments``."""
    caught = Caught()
    with pytest.raises(error_type) as info:
        yield caught
    error = info.value
    # bad input is a ValueError; a communicator that cannot take the call is not
    is_value_error = error_type is col.InvalidArgumentError
    assert isinstance(error, ValueError) == is_value_error and isinstance(
        error, col.CollectivesError
    )
    caught.message = message = str(error)
    assert message.startswith(f"{call}: "), message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def in_step(comm, xp=np) -> None:
    """A real collective after the failures: every rank must still be at the same call."""
    x = xp.array([comm.rank + 1], np.int64)
    comm.all_reduce(x)
    assert int(x[0]) == comm.size * (comm.size + 1) // 2


def host(a) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy array."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


def finished(comm, call: str, *args, **kwargs):
    """Make ``call`` and return once it has completed here (or raise); on NCCL, where a
    synchronous call returns once queued, through ``async_op=True`` and ``synchronize()``."""
    if comm.backend == "nccl":
        return getattr(comm, call)(*args, async_op=True, **kwargs).synchronize()
    return getattr(comm, call)(*args, **kwargs)


class Sub(np.ndarray):
    """A NumPy subclass: the same memory kind but not the same array type as x."""


def test_unsupported_dtypes(comm, xp):
    dtypes = [np.bool_, np.int16, np.uint16]
    if xp is np:  # dtypes CuPy has no arrays of
        dtypes.append(np.float128 if hasattr(np, "float128") else "U2")
    for dtype in dtypes:
        x = xp.zeros(4, dtype)
        name = str(np.dtype(dtype))
        with fails("all_reduce", f"x has dtype {name}", "expected one of"):
            comm.all_reduce(x)
        with fails("broadcast", f"x has dtype {name}", "float32"):
            comm.broadcast(x)
        with fails("send", f"x has dtype {name}"):
            comm.send(x, 0)
        good = xp.zeros(4, np.float32)
        with fails("all_reduce", f"out has dtype {name}"):
            comm.all_reduce(good, out=x)
    with fails("all_gather", "as_bfloat16") as caught:
        comm.all_gather(xp.zeros(2, np.uint16))
    msg = caught.message
    assert "uint16" in msg
    in_step(comm, xp)


def test_not_an_array(comm, xp):
    for obj in ([1.0, 2.0], 3.0, "abc", None):
        with fails("all_reduce", "x must be a NumPy or CuPy array", type(obj).__name__):
            comm.all_reduce(obj)
    with fails("recv", "x must be", "list"):
        comm.recv([0, 0], 0)
    with fails("all_reduce", "out must be", "list"):
        comm.all_reduce(xp.zeros(2), out=[0.0, 0.0])
    in_step(comm, xp)


def test_non_contiguous(comm, xp):
    size = comm.size
    strided = xp.zeros((4, 6), np.float32)[:, ::2]
    fortran = xp.asfortranarray(xp.zeros((3, 4), np.float64))
    for x in (strided, fortran):
        with fails("all_reduce", "x must be C-contiguous", str(x.strides)):
            comm.all_reduce(x)
        with fails("broadcast", "C-contiguous"):
            comm.broadcast(x)
        with fails("all_gather", "C-contiguous"):
            comm.all_gather(x)
    good = xp.zeros((4, 3), np.float32)
    with fails("all_reduce", "out must be C-contiguous"):
        comm.all_reduce(good, out=strided)
    gathered = xp.zeros((size, 4, 6), np.float32)[:, :, ::2]
    with fails("all_gather", "out must be C-contiguous"):
        comm.all_gather(good, out=gathered)
    in_step(comm, xp)


def read_only(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@pytest.mark.numpy_only(reason="CuPy arrays have no read-only flag")
def test_read_only_results(comm):
    """A read-only array where a result is written fails on the rank that has it; one that is
    only read (a send buffer, broadcast's root) works."""
    size, rank = comm.size, comm.rank
    fixed = read_only(np.full(4, rank + 1.0, np.float32))
    with fails("all_reduce", "x is read-only", "writes its result there"):
        comm.all_reduce(fixed)
    with fails("all_reduce", "out is read-only"):
        comm.all_reduce(np.ones(4, np.float32), out=read_only(np.zeros(4, np.float32)))
    with fails("all_gather", "out is read-only"):
        comm.all_gather(fixed, out=read_only(np.zeros((size, 4), np.float32)))
    with fails("reduce_scatter", "out is read-only"):
        comm.reduce_scatter(np.ones((size, 2), np.int32), out=read_only(np.zeros(2, np.int32)))
    with fails("all_reduce", "x is read-only"):
        with comm.group():
            comm.all_reduce(fixed)
    # Read-only inputs are fine.
    out = comm.all_reduce(fixed, out=np.zeros(4, np.float32))
    np.testing.assert_array_equal(out, size * (size + 1) / 2)
    np.testing.assert_array_equal(comm.all_gather(fixed)[:, 0], np.arange(1, size + 1))
    # broadcast only reads x on the root: read-only works there (off root it fails the
    # communicator on every rank: test_one_sided_errors.py).
    x = np.full(3, 7 if rank == 0 else 0, np.int64)
    np.testing.assert_array_equal(comm.broadcast(read_only(x) if rank == 0 else x), 7)
    in_step(comm)


def test_out_of_wrong_shape_dtype_or_type(comm, xp):
    size = comm.size
    x = xp.zeros((3, 4), np.float32)
    with fails("all_reduce", "out has shape (4, 3), expected (3, 4)"):
        comm.all_reduce(x, out=xp.zeros((4, 3), np.float32))
    with fails("all_reduce", "out has dtype float64, expected float32"):
        comm.all_reduce(x, out=xp.zeros((3, 4), np.float64))
    with fails("all_gather", f"out has shape ({size + 1}, 3, 4), expected ({size}, 3, 4)"):
        comm.all_gather(x, out=xp.zeros((size + 1, 3, 4), np.float32))
    with fails("all_gather", f"expected ({size}, 3, 4)"):
        comm.all_gather(x, out=xp.zeros((3, 4), np.float32))
    xs = xp.zeros((size, 3), np.int32)
    with fails("reduce_scatter", f"out has shape ({size}, 3), expected (3,)"):
        comm.reduce_scatter(xs, out=xp.zeros((size, 3), np.int32))
    with fails("all_to_all", "out has dtype int64, expected int32"):
        comm.all_to_all(xs, out=xp.zeros((size, 3), np.int64))
    # reduce's, gather's and scatter's: test_one_sided_errors.py (they fail the communicator)
    if xp is np:
        other, kind = np.zeros((3, 4), np.float32).view(Sub), "Sub"
    else:  # a host array beside a device one
        other, kind = np.zeros((3, 4), np.float32), "numpy.ndarray"
    with fails("all_reduce", "out is a", kind, "like x"):
        comm.all_reduce(x, out=other)
    bits = col.as_bfloat16(xp.zeros((3, 4), np.uint16))
    with fails("all_reduce", "out has dtype bfloat16", "expected float32"):
        comm.all_reduce(x, out=bits)
    in_step(comm, xp)


def test_partially_overlapping_out(comm, xp):
    buf = xp.zeros(8, np.float32)
    with fails("all_reduce", "out overlaps x without being the same memory"):
        comm.all_reduce(buf[0:4], out=buf[2:6])
    size = comm.size
    whole = xp.zeros((size + 1) * 2, np.float32)
    # x inside out, but not at this rank's slot: out[rank + 1] is not x's place.
    x = whole[2 * (comm.rank + 1) : 2 * (comm.rank + 2)]
    out = whole[: 2 * size].reshape(size, 2) if comm.rank + 1 < size else None
    if out is not None:
        with fails("all_gather", "overlaps"):
            comm.all_gather(x, out=out)
    shifted = whole[1 : 1 + 2 * size].reshape(size, 2)
    with fails("all_gather", "overlaps"):
        comm.all_gather(whole[0:2], out=shifted)
    flat = xp.zeros(2 * size + 1, np.float32)
    x, out = flat[: 2 * size].reshape(size, 2), flat[1:].reshape(size, 2)
    with fails("all_to_all", "overlaps"):
        comm.all_to_all(x, out=out)
    # The identical array is the in-place form, not an overlap.
    y = xp.ones(4, np.float32)
    comm.all_reduce(y, out=y)
    np.testing.assert_array_equal(host(y), comm.size)
    in_step(comm, xp)


def test_scatter_out_checked_against_x_off_root(comm, xp):
    """Off root, an ``x`` given beside ``out`` fixes out's shape: a wrong out fails (scatter's
    arguments depend on the role: the communicator fails too, test_one_sided_errors.py)."""
    size = comm.size
    # A short timeout: if one rank wrongly went on to communicate, it fails soon, not hangs.
    short = col.init(backend=comm.backend, timeout=3, mpi_blocking=False)
    try:
        xs = xp.zeros((size, 3), np.int32)
        with fails("scatter", "out has shape (4,), expected (3,)"):
            short.scatter(xs, out=xp.zeros(4, np.int32))
        with fails("scatter", "out has dtype int64, expected int32"):
            short.scatter(xs, out=xp.zeros(3, np.int64))
        with fails("scatter", "x is required on root", "None"):
            short.scatter(None)
    finally:
        short.close()
        in_step(comm, xp)  # every rank gets here, failed or not: the next test starts in step


def test_leading_axis_must_be_size(comm, xp):
    size = comm.size
    bad = xp.zeros((size + 1, 2), np.float32)
    scalar = xp.zeros((), np.float32)
    for x, shape in ((bad, (size + 1, 2)), (scalar, ())):
        expected = f"x has shape {shape}, expected a first axis of size {size}"
        with fails("reduce_scatter", expected):
            comm.reduce_scatter(x)
        with fails("all_to_all", expected):
            comm.all_to_all(x)
    in_step(comm, xp)


def test_root_out_of_range(comm, xp):
    size = comm.size
    x = xp.zeros(2, np.float32)
    for root in (size, -1, 1.0, "0", None, True):
        expected = f"root must be an int in [0, {size}), got {root!r}"
        with fails("reduce", expected):
            comm.reduce(x, root)
        with fails("broadcast", expected):
            comm.broadcast(x, root=root)
        with fails("gather", expected):
            comm.gather(x, root)
        with fails("scatter", expected):
            comm.scatter(xp.zeros((size, 2)), root)
    in_step(comm, xp)


def test_peer_out_of_range_and_self(comm, xp):
    size, rank = comm.size, comm.rank
    x = xp.zeros(2, np.float32)
    for peer in (size, -1, 0.0, "1", None):
        expected = f"peer must be an int in [0, {size}), got {peer!r}"
        with fails("send", expected):
            comm.send(x, peer)
        with fails("recv", expected):
            comm.recv(x, peer)
    with fails("send", f"peer {rank} is this rank", "comm.group()"):
        comm.send(x, rank)
    with fails("recv", "is this rank"):
        comm.recv(x, rank, async_op=True)
    in_step(comm, xp)


def test_sendrecv_peers_and_out(comm, xp):
    size, rank = comm.size, comm.rank
    x = xp.zeros(2, np.float32)
    other = (rank + 1) % size
    for peer in (size, -1, 0.0, None):
        with fails("sendrecv", f"peer must be an int in [0, {size}), got {peer!r}"):
            comm.sendrecv(x, peer)
        if peer is not None:  # (source=None is the peer)
            with fails("sendrecv", f"source must be an int in [0, {size}), got {peer!r}"):
                comm.sendrecv(x, rank, source=peer)
    if size > 1:  # a message to itself that its sendrecv does not receive, or the reverse
        with fails("sendrecv", f"peer {rank} and source {other}", "comm.group()"):
            comm.sendrecv(x, rank, source=other)
        with fails("sendrecv", f"peer {other} and source {rank}", "comm.group()"):
            comm.sendrecv(x, other, source=rank, async_op=True)
    with fails("sendrecv", "out is x", "two arrays"):
        comm.sendrecv(x, other, out=x)
    with fails("sendrecv", "out"):
        comm.sendrecv(x, other, out=xp.zeros(3, np.float32))
    with fails("sendrecv", "out"):
        comm.sendrecv(x, other, out=xp.zeros(2, np.float64))
    if xp is np:
        buf = np.zeros(4, np.float32)
        with fails("sendrecv", "overlaps"):
            comm.sendrecv(buf[:2], other, out=buf[1:3])
        read_only = np.zeros(2, np.float32)
        read_only.flags.writeable = False
        with fails("sendrecv", "read-only"):
            comm.sendrecv(x, other, out=read_only)
    in_step(comm, xp)


def test_a_group_s_send_and_receive_of_the_same_memory_are_refused(backend, xp):
    """Inside ``comm.group()``, a receive into memory that a send of the block reads, or a
    send of memory that a receive of the block writes, is refused (MPI leaves it undefined;
    MPICH aborted the job on such a message to a rank itself). The block's earlier calls were
    posted, so the communicator fails; every rank makes the same block here."""
    cases = [
        ("recv", "receives into memory that a send", lambda c, buf, nxt, prv: (
            c.send(buf, nxt), c.recv(buf[2:], prv))),
        ("send", "sends memory that a receive", lambda c, buf, nxt, prv: (
            c.recv(buf, prv), c.send(buf[:2], nxt))),
        ("sendrecv", "receives into memory that a send", lambda c, buf, nxt, prv: (
            c.send(buf[:2], nxt), c.sendrecv(buf[2:], nxt, out=buf[:2], source=prv))),
    ]  # fmt: skip
    for call, fragment, block in cases:
        c = col.init(backend=backend, timeout=30)
        nxt, prv = (c.rank + 1) % c.size, (c.rank - 1) % c.size
        buf = xp.arange(6, dtype=np.float32)[:4]
        with fails(call, fragment, "comm.group()"):
            with c.group():
                block(c, buf, nxt, prv)
        with fails("all_reduce", "unusable", error_type=col.CommunicatorStateError):
            c.all_reduce(xp.ones(2, np.float32))
        c.close()
    # distinct buffers in a group, to itself included, go through
    c = col.init(backend=backend, timeout=30)
    rank, size = c.rank, c.size
    sent, received = xp.full(2, rank + 1, np.float32), xp.zeros(2, np.float32)
    with c.group():
        c.send(sent, (rank + 1) % size)
        c.recv(received, (rank - 1) % size)
    assert float(received[0]) == (rank - 1) % size + 1
    in_step(c, xp)
    c.close()


def test_bad_op(comm, xp):
    size = comm.size
    x = xp.zeros(2, np.float32)
    for op in ("mean", "", "add", 3, None):
        expected = f"op must be one of sum, prod, max, min, avg, got {op!r}"
        with fails("all_reduce", expected):
            comm.all_reduce(x, op)
        with fails("reduce", expected):
            comm.reduce(x, op=op)
        with fails("reduce_scatter", expected):
            comm.reduce_scatter(xp.zeros((size, 2)), op)
    for dtype in (np.complex64, np.complex128):
        z = xp.zeros(2, dtype)
        name = np.dtype(dtype).name
        for op in ("max", "min", "prod", col.ReduceOp.MAX):
            expected = f"op {col.ReduceOp[str(op).upper()]} is not defined for {name}"
            with fails("all_reduce", expected, "expected sum or avg"):
                comm.all_reduce(z, op)
            with fails("reduce", expected):
                comm.reduce(z, op=op)
    in_step(comm, xp)


def test_use_after_close_and_abort(backend, xp):
    for end, word in (("close", "closed"), ("abort", "aborted")):
        c = col.init(backend=backend, timeout=30)
        in_step(c, xp)
        getattr(c, end)()
        x = xp.zeros(2, np.float32)
        state = col.CommunicatorStateError
        verb = "is" if word == "closed" else "was"
        with fails("all_reduce", f"communicator {verb} {word}", error_type=state):
            c.all_reduce(x)
        with fails("barrier", word, error_type=state):
            c.barrier(async_op=True)
        with fails("all_gather", word, f"rank {c.rank}", error_type=state):
            c.all_gather(x)
        with fails("split", word, error_type=state):
            c.split(0)
        c.close()


def test_empty_arrays_work(comm, xp):
    """Not an error: size-0 arrays go through every verb."""
    size = comm.size
    e = xp.zeros((0, 3), np.float32)
    assert comm.all_reduce(e) is e
    assert comm.all_gather(e).shape == (size, 0, 3)
    assert comm.reduce_scatter(xp.zeros((size, 0))).shape == (0,)
    assert comm.all_to_all(xp.zeros((size, 0))).shape == (size, 0)
    comm.broadcast(e, size - 1)
    in_step(comm, xp)


# ---------------------------------------------------------------- threads and timeouts


def _wait_for(condition, what: str, limit: float = 20.0) -> None:
    deadline = time.monotonic() + limit
    while not condition():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.01)


def test_collective_that_times_out(comm, xp):
    if comm.size == 1 and comm.backend == "nccl":
        pytest.skip("at size 1 only a receive from itself with no send can wait: not an NCCL call")
    timeout = 1.5
    short = init_with_short_timeout(comm.backend, timeout, mpi_blocking=False)
    try:
        if comm.rank == 0:
            start = time.monotonic()
            with pytest.raises(col.CollectiveTimeoutError) as info:
                if comm.size == 1:  # the only way to make a call wait at size 1
                    with short.group():
                        short.recv(xp.zeros(1), 0)
                else:  # the other ranks never call it
                    finished(short, "all_reduce", xp.zeros(4, np.float32))
            waited = time.monotonic() - start
            message = str(info.value)
            call = "recv" if comm.size == 1 else "all_reduce"
            first = warm_up_counts(short)[0] + 1
            assert message.startswith(f"{call} #{first}"), message
            assert f"timeout {timeout:g} s" in message and "rank 0" in message
            assert isinstance(info.value, TimeoutError)
            # A hang guard, not a performance check: the contract is timeout + 2 s.
            assert waited < timeout + 15, f"took {waited:.1f} s to time out"
            for call, fn in (
                ("all_reduce", lambda: short.all_reduce(xp.zeros(4, np.float32))),
                ("barrier", lambda: short.barrier()),
            ):
                with pytest.raises(col.CollectivesError) as again:
                    fn()
                assert str(again.value).startswith(f"{call}: communicator is unusable"), str(
                    again.value
                )
                assert "did not complete" in str(again.value)
    finally:
        short.close()
    in_step(comm, xp)


def _gpus() -> int:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:
        return 0


def test_nccl_rejects_host_and_wrong_device_arrays(comm, xp):
    gpus = _gpus()
    if gpus < comm.size:
        pytest.skip(f"needs one GPU per rank, found {gpus} for {comm.size} ranks")
    import cupy

    with col.init(backend="nccl", timeout=30) as g:
        with fails("all_reduce", "x must be a CuPy array", "numpy.ndarray"):
            g.all_reduce(np.zeros(4, np.float32))
        # the front end refuses first: out must be of x's kind
        with fails("all_gather", "out is a numpy.ndarray", "expected a cupy"):
            g.all_gather(cupy.zeros(4, cupy.float32), out=np.zeros((g.size, 4), np.float32))
        if gpus > 1:
            other = (g.device + 1) % gpus
            with cupy.cuda.Device(other):
                elsewhere = cupy.zeros(4, cupy.float32)
            with fails("broadcast", f"x is on device {other}", f"expected device {g.device}"):
                g.broadcast(elsewhere)
        x = cupy.ones(3, cupy.float32)
        g.all_reduce(x)
        assert float(x.sum().get()) == 3 * g.size
    in_step(comm, xp)
