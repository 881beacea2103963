"""A call in flight owns every array MPI reads or writes, temporaries included.

mpi4py requests do not keep their buffers alive. The MPI backend reduces bfloat16 (and
float16 where the MPI library has no float16 type) in float32 copies, and stages CuPy arrays
through host copies: if such a temporary were freed before the request completed, its memory
could be handed out again while MPI still read or wrote it. Here a second thread allocates and
fills arrays of the temporaries' sizes the whole time, and the main thread collects garbage
between post and wait, so freed memory is reused at once; every element is then checked.
"""

from __future__ import annotations

import gc
import os
import threading
import time

import numpy as np
import pytest

import collectives as col
from collectives import _mpi

pytestmark = pytest.mark.skipif(
    os.environ.get("COLLECTIVES_TEST_BACKEND") == "nccl", reason="the MPI backend's arrays"
)
WORLD_SIZES = (2, 3)
SPMD_TIMEOUT = 300

COUNTS = (1024, 1 << 20)
GARBAGE = -12345.0  # what the churning thread writes: never a correct result


@pytest.fixture
def churn():
    """A thread that allocates, fills and frees arrays of many sizes until the test ends."""
    stop = threading.Event()
    sizes = [c * k for c in COUNTS for k in (1, 2, 3)]

    def run() -> None:
        while not stop.is_set():
            for size in sizes:
                np.full(size, GARBAGE, np.float32)
                np.full(size, GARBAGE, np.float16)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    yield
    stop.set()
    thread.join()


def _widened_or_staged_dtypes(xp) -> list[str]:
    # bfloat16 is always reduced in float32; float16 is where MPI lacks it. CuPy arrays are
    # staged through host copies whatever their dtype (unless MPI is CUDA-aware).
    names = sorted(_mpi.UPCAST)
    if xp is not np and "float32" not in names:
        names.append("float32")
    return names


def _as(xp, values, name: str):
    """float32 ``values`` (exact in every dtype used) as an array of dtype ``name``."""
    values = xp.asarray(values, xp.float32)
    if name == "bfloat16":
        return col.as_bfloat16((values.view(xp.uint32) >> 16).astype(xp.uint16))
    return values.astype(name)


def _values(result, name: str) -> np.ndarray:
    """The result as float32 on the host."""
    array = result.array if isinstance(result, col.BFloat16Array) else result
    array = array.get() if hasattr(array, "get") else np.asarray(array)
    if name == "bfloat16":
        return (array.astype(np.uint32) << 16).view(np.float32)
    return array.astype(np.float32)


def _inputs(xp, shape, rank: int, salt: int) -> np.ndarray:
    # small integers: exact in bfloat16 and float16, and so are their sums over a few ranks
    return (np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape) + salt) % 13 + rank


def _finish(comm, work, async_op: bool) -> None:
    if async_op:
        gc.collect()  # anything only a request referred to is freed here, and reused at once
        work.wait()


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "inplace"])
@pytest.mark.parametrize("verb", ["all_reduce", "reduce", "reduce_scatter"])
def test_reductions_through_temporaries(comm, xp, churn, verb, in_place, async_op):
    size, rank = comm.size, comm.rank
    wrong = []
    for name in _widened_or_staged_dtypes(xp):
        for count in COUNTS:
            for salt in range(3):
                shape = (size, count // size) if verb == "reduce_scatter" else (count,)
                mine = _inputs(xp, shape, rank, salt)
                expected = sum(_inputs(xp, shape, r, salt) for r in range(size))
                x = _as(xp, mine, name)
                target = x.array if isinstance(x, col.BFloat16Array) else x
                if verb == "reduce_scatter":
                    expected = expected[rank]
                    out = (
                        (col.as_bfloat16(target[rank]) if name == "bfloat16" else target[rank])
                        if in_place
                        else _as(xp, np.zeros(shape[1:]), name)
                    )
                    work = comm.reduce_scatter(x, out=out, async_op=async_op)
                elif verb == "reduce":
                    out = x if in_place else _as(xp, np.zeros(shape), name)
                    work = comm.reduce(x, root=0, out=out, async_op=async_op)
                else:
                    out = x if in_place else _as(xp, np.zeros(shape), name)
                    work = comm.all_reduce(x, out=out, async_op=async_op)
                _finish(comm, work, async_op)
                if verb == "reduce" and rank != 0:
                    continue
                bad = int(np.count_nonzero(_values(out, name) != expected))
                if bad:
                    wrong.append(f"{name}, {count} elements, salt {salt}: {bad} wrong")
    assert not wrong, f"{verb} on rank {rank}: " + "; ".join(wrong)


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_staged_verbs_without_reductions(comm, xp, churn, async_op):
    # The copies that stage CuPy arrays for all_gather, broadcast and send/recv (on NumPy
    # these pass the caller's arrays, which the pending holds too).
    size, rank = comm.size, comm.rank
    count = COUNTS[-1]
    mine = xp.asarray(_inputs(xp, (count,), rank, 0))
    gathered = xp.zeros((size, count), xp.float32)
    work = comm.all_gather(mine, out=gathered, async_op=async_op)
    _finish(comm, work, async_op)
    expected = np.stack([_inputs(xp, (count,), r, 0) for r in range(size)])
    assert np.array_equal(_values(gathered, "float32"), expected)

    y = xp.asarray(_inputs(xp, (count,), rank, 1))
    work = comm.broadcast(y, root=size - 1, async_op=async_op)
    _finish(comm, work, async_op)
    assert np.array_equal(_values(y, "float32"), _inputs(xp, (count,), size - 1, 1))

    received = xp.zeros(count, xp.float32)
    with comm.group():
        comm.send(mine, (rank + 1) % size)
        comm.recv(received, (rank - 1) % size)
    assert np.array_equal(_values(received, "float32"), _inputs(xp, (count,), (rank - 1) % size, 0))


def test_a_dropped_work_keeps_its_arrays(comm):
    # Nobody waits for it: the backend still owns its arrays until MPI has finished with them.
    bits = _as(np, np.ones(8), "bfloat16")
    comm.all_reduce(bits, out=_as(np, np.zeros(8), "bfloat16"), async_op=True)
    gc.collect()
    in_flight = comm._impl.in_flight
    assert [p for p in in_flight if p.arrays is not None], "its arrays were dropped"
    for _ in range(2 * _mpi._REAP_AT):
        comm.all_reduce(np.ones(1), async_op=True)
    comm.barrier()
    deadline = time.monotonic() + 10
    while in_flight and time.monotonic() < deadline:
        comm._impl._reap()
    assert not in_flight, "calls that MPI finished are still held"


def test_a_call_unfinished_at_abort_keeps_its_arrays_and_its_communicator(comm):
    if comm.size == 1:
        pytest.skip("needs a peer that sends after the receiver aborted")
    from mpi4py import MPI

    if comm.rank == 0:
        buffer = np.zeros(4)
        comm.recv(buffer, 1, async_op=True)  # the Work is dropped at once
        comm.abort()
        kept = [
            p
            for p in _mpi._ABANDONED
            # the arrays as MPI was given them: an [array, datatype] spec, or the array itself
            if any(a is buffer or (isinstance(a, list) and a[0] is buffer) for a in p.arrays or ())
        ]
        assert kept, "an unfinished receive's buffer was let go at abort"
        assert comm._impl.unfinished and comm.mpi_comm != MPI.COMM_NULL  # not freed under it
        MPI.COMM_WORLD.Barrier()  # now rank 1 sends
        deadline = time.monotonic() + 10
        while kept[0] in _mpi._ABANDONED and time.monotonic() < deadline:
            _mpi.abandon(set())  # each abandon looks again at what was kept
        assert kept[0] not in _mpi._ABANDONED, "a finished call is still kept"
        assert np.array_equal(buffer, np.arange(4.0))  # MPI wrote it after the close
    else:
        MPI.COMM_WORLD.Barrier()
        if comm.rank == 1:
            comm.send(np.arange(4.0), 0)
