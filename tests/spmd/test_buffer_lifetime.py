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
import weakref

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col

pytestmark = pytest.mark.skipif(
    os.environ.get("COLLECTIVES_TEST_BACKEND") == "nccl", reason="the MPI backend's arrays"
)
WORLD_SIZES = (2, 3)
SPMD_TIMEOUT = 300

COUNTS = (1024, 1 << 18)  # 1 MiB of float32: past every MPI's eager limit
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
    # bfloat16 is always reduced in float32, float16 where MPI lacks it (both are tested,
    # whichever this MPI does). CuPy arrays are staged through host copies whatever their
    # dtype (unless MPI is CUDA-aware).
    names = ["bfloat16", "float16"]
    if xp is not np:
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
            for salt in range(2):
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


def test_a_dropped_work_keeps_its_arrays_until_mpi_is_done_with_them(churn):
    # Nobody waits for it, and rank 1 has not made its part yet: the backend still owns the
    # bfloat16 output, and the float32 copies that MPI reads and writes (were they freed, the
    # churning thread would fill them with GARBAGE before MPI used them).
    comm = col.init("mpi", timeout=30.0, mpi_blocking=False)  # rank 0's call stays posted
    if comm.size == 1:
        comm.close()
        pytest.skip("needs a peer that joins the call later")
    size, rank = comm.size, comm.rank
    values = np.arange(1024, dtype=np.float32) % 7
    x = _as(np, values + rank, "bfloat16")
    out = _as(np, np.zeros(1024), "bfloat16")
    kept = weakref.ref(out.array)
    if rank == 0:
        comm.all_reduce(x, out=out, async_op=True)  # the Work is dropped at once
        del x, out
        gc.collect()  # and whatever was freed is reused at once
        assert kept() is not None, "the output of an unfinished call was let go"
        result = kept()  # held again, to read once the call is done
        MPI.COMM_WORLD.Barrier()  # now rank 1 makes its part
    else:
        MPI.COMM_WORLD.Barrier()
        comm.all_reduce(x, out=out)
        result = out.array
        del x, out
    comm.close()  # the calls in flight finish first, the dropped one too
    expected = size * values + sum(range(size))
    assert np.array_equal(_values(col.as_bfloat16(result), "bfloat16"), expected)
    del result
    gc.collect()
    assert kept() is None, "the arrays of a finished call are still held"


def test_arrays_of_calls_nobody_waits_for_are_let_go_once_done(comm):
    # Calls whose Work is dropped are completed by later calls: their arrays do not pile up.
    refs = []
    for _ in range(200):
        x = np.ones(4)
        refs.append(weakref.ref(x))
        comm.all_reduce(x, async_op=True)
    del x
    comm.barrier()
    for _ in range(400):  # later calls look at those in flight as they go
        comm.barrier(async_op=True)
    comm.barrier()
    gc.collect()
    held = sum(ref() is not None for ref in refs)
    assert held == 0, f"{held} of {len(refs)} finished calls still hold their arrays"


def test_a_call_unfinished_at_abort_keeps_its_arrays_and_its_communicator(comm):
    if comm.size == 1:
        pytest.skip("needs a peer that sends after the receiver aborted")
    aborted = col.init("mpi", timeout=30.0)
    spare = comm.split(0)  # closed below, on rank 0 alone: each close looks at what was kept
    if comm.rank == 0:
        buffer = np.zeros(4)
        kept = weakref.ref(buffer)
        aborted.recv(buffer, 1, async_op=True)  # the Work is dropped at once
        aborted.abort()
        assert aborted.mpi_comm != MPI.COMM_NULL  # not freed under the receive
        del buffer, aborted  # the communicator and its flight record go too
        gc.collect()
        assert kept() is not None, "an unfinished receive's buffer was let go at abort"
        MPI.COMM_WORLD.Barrier()  # now rank 1 sends
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            received = kept()
            if received is not None and np.array_equal(received, np.arange(4.0)):
                break  # MPI wrote it after the abort
            del received
            MPI.COMM_WORLD.Iprobe()  # lets MPI progress
        else:
            pytest.fail("the receive never completed into its buffer")
        del received
        spare.close()  # looks again at what was kept: the receive has finished
        gc.collect()
        assert kept() is None, "a finished call is still kept"
    else:
        MPI.COMM_WORLD.Barrier()
        if comm.rank == 1:
            aborted.send(np.arange(4.0), 0)
        aborted.close()
        spare.close()
