"""The NCCL backend on CuPy arrays (skipped where there is no GPU or no NCCL).

At world size 2 this needs two GPUs, or one GPU with NCCL >= 2.30.3 and
``NCCL_MULTI_RANK_GPU_ENABLE=1`` (the ``nccl_world`` fixture of conftest.py skips otherwise).

White-box on purpose (one of the few test modules that reach private names): besides the
calls, these are regression tests of the backend's watchdog and flight of calls (when arrays
are released after an abort, what a failed issue or a watchdog exception leaves, the split
fallback), whose failures are injected into the backend (``comm._impl``) and observed
there, since no public call can make NCCL fail that way on demand.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

import collectives as col
from collectives._nccl.backend import nccl_unavailable_reason
from tests.short_timeout import init_with_short_timeout

WORLD_SIZES = (1, 2)

# Tests that need NCCL to load but not the world to fit it (the fallback test) skip by this.
_UNAVAILABLE = nccl_unavailable_reason()
needs_nccl = pytest.mark.skipif(_UNAVAILABLE is not None, reason=f"NCCL backend: {_UNAVAILABLE}")


@pytest.fixture
def nccl(nccl_world):
    comm = col.init(backend="nccl", timeout=60)
    yield comm
    comm.close()


def _data(rank: int, shape, dtype):
    return (np.arange(int(np.prod(shape))).reshape(shape) % 5 + rank + 1).astype(dtype)


@pytest.mark.parametrize(
    "dtype",
    ["float16", "float32", "float64", "int8", "uint8", "int32", "uint32", "int64", "uint64"],
)
def test_all_reduce_every_dtype(nccl, dtype):
    import cupy

    size, rank = nccl.size, nccl.rank
    expected = sum(_data(r, (3, 4), np.float64) for r in range(size)).astype(dtype)
    x = cupy.asarray(_data(rank, (3, 4), dtype))
    out = cupy.empty_like(x)
    nccl.all_reduce(x, out=out)
    np.testing.assert_array_equal(out.get(), expected)
    nccl.all_reduce(x)  # in place
    np.testing.assert_array_equal(x.get(), expected)


@pytest.mark.parametrize("op", ["sum", "prod", "max", "min", "avg"])
def test_all_reduce_every_op(nccl, op):
    import cupy

    size = nccl.size
    stack = np.stack([_data(r, (8,), np.float64) for r in range(size)])
    expected = {
        "sum": stack.sum(0),
        "prod": stack.prod(0),
        "max": stack.max(0),
        "min": stack.min(0),
        "avg": stack.mean(0),
    }[op]
    x = cupy.asarray(_data(nccl.rank, (8,), np.float64))
    nccl.all_reduce(x, op=op)
    np.testing.assert_allclose(x.get(), expected)


def test_bfloat16_and_complex(nccl):
    import cupy

    size = nccl.size
    bits = cupy.full(4, 0x3F80, cupy.uint16)  # 1.0 in bfloat16
    nccl.all_reduce(col.as_bfloat16(bits))
    expected = (np.array([float(size)], np.float32).view(np.uint32) >> 16).astype(np.uint16)
    assert int(bits.get()[0]) == int(expected[0])
    z = cupy.full(3, 1 + 2j, cupy.complex64)
    nccl.all_reduce(z, op="avg")
    np.testing.assert_allclose(z.get(), np.full(3, 1 + 2j))


def test_every_verb(nccl):
    import cupy

    size, rank = nccl.size, nccl.rank
    root = size - 1
    x = cupy.full(3, rank, cupy.float32)
    assert nccl.all_gather(x).get().tolist() == [[r] * 3 for r in range(size)]
    b = cupy.full(2, rank, cupy.int64)
    assert nccl.broadcast(b, root=root).get().tolist() == [root, root]
    r = nccl.reduce(cupy.ones(2), root=root)
    if rank == root:
        assert r.get().tolist() == [size, size]
    rs = nccl.reduce_scatter(cupy.ones((size, 2)))
    assert rs.get().tolist() == [size, size]
    a2a = nccl.all_to_all(cupy.arange(size, dtype=cupy.int32) + 10 * rank)
    assert a2a.get().tolist() == [rank + 10 * j for j in range(size)]
    g = nccl.gather(x, root=root)
    if rank == root:
        assert g.get()[:, 0].tolist() == list(range(size))
    sc = nccl.scatter(
        cupy.arange(size * 2.0).reshape(size, 2) if rank == 0 else None, out=cupy.empty(2), root=0
    )
    assert sc.get().tolist() == [2.0 * rank, 2.0 * rank + 1]
    with nccl.group():
        nccl.send(cupy.full(2, rank, cupy.float64), (rank + 1) % size)
        got = nccl.recv(cupy.empty(2), (rank - 1) % size)
    assert got.get().tolist() == [(rank - 1) % size] * 2
    nccl.barrier()


def test_stream_semantics_and_async(nccl):
    import cupy

    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        x = cupy.ones(1 << 20, cupy.float32)
        x *= 2  # queued on `side`: the collective must run after it
        work = nccl.all_reduce(x, async_op=True)
        work.wait()  # orders `side` after the result
        total = float(x.sum().get())
    assert total == 2.0 * nccl.size * (1 << 20)
    assert work.is_completed() or work.synchronize() is x
    assert nccl.stream is not None and nccl.device == cupy.cuda.Device().id


_SPIN = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""


def test_group_orders_each_call_after_the_callers_stream(nccl):
    """Work queued between two calls of a group runs before the group's transfers."""
    import cupy

    size, rank = nccl.size, nccl.rank
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    spin = cupy.RawKernel(_SPIN, "spin")
    side = cupy.cuda.Stream(non_blocking=True)
    with side:
        a, b = cupy.zeros(4, cupy.float32), cupy.zeros(4, cupy.float32)
        got_a, got_b = cupy.empty_like(a), cupy.empty_like(b)
        with nccl.group():
            nccl.send(a, nxt)
            nccl.recv(got_a, prv)
            spin((1,), (1,), (cupy.int64(1 << 27),))  # keeps `side` busy for a while
            b.fill(rank + 1)
            nccl.send(b, nxt)
            nccl.recv(got_b, prv)
        assert got_b.get().tolist() == [prv + 1.0] * 4
        assert got_a.get().tolist() == [0.0] * 4


def test_host_array_is_rejected(nccl):
    with pytest.raises(col.InvalidArgumentError, match="must be a CuPy array on device"):
        nccl.all_reduce(np.ones(3))


def test_split_and_mesh(nccl):
    import cupy

    half = nccl.split(nccl.rank % 2)
    x = cupy.ones(2)
    half.all_reduce(x)
    assert x.get().tolist() == [half.size] * 2
    half.close()


def test_wait_inside_an_unfinished_group_is_a_clear_error(nccl):
    import cupy

    x = cupy.ones(2)
    with nccl.group():
        work = nccl.all_reduce(x, async_op=True)
        with pytest.raises(col.InvalidArgumentError, match="has not ended"):
            work.wait()
    work.wait()
    assert x.get().tolist() == [nccl.size] * 2


# ---------------------------------------------------------------- issue 14, section 1


def test_a_call_on_another_communicator_inside_a_group_completes_at_its_end(nccl):
    """Defect 1: NCCL's group is per thread, so commB's calls inside commA.group() are
    launched at its end; their completion must not be recorded before."""
    import cupy

    size, rank = nccl.size, nccl.rank
    other = col.init(backend="nccl", timeout=60)
    try:
        y, z = cupy.ones(4, cupy.float32), cupy.ones(2)
        a, got = cupy.full(3, rank, cupy.float32), cupy.empty(3, cupy.float32)
        with nccl.group():
            nccl.send(a, (rank + 1) % size)
            nccl.recv(got, (rank - 1) % size)
            other.all_reduce(y)  # synchronous: ordered at the group's end
            work = other.all_reduce(z, async_op=True)
            time.sleep(0.05)
            assert not work.is_completed()  # NCCL holds it: nothing has run yet
        work.wait()
        assert y.get().tolist() == [float(size)] * 4
        assert z.get().tolist() == [float(size)] * 2
        assert got.get().tolist() == [float((rank - 1) % size)] * 3
    finally:
        other.close()


def test_a_timeout_aborts_and_releases_the_arrays_only_after_the_stream_drains(nccl):
    """Defect 2: past the timeout the communicator is aborted (never under a thread inside
    NCCL), and the arrays of the call stay referenced until the stream is idle."""
    import cupy

    if nccl.size < 2:
        pytest.skip("needs a peer that does not arrive")
    comm = init_with_short_timeout("nccl", 2.0)
    x = cupy.ones(1024, cupy.float32)
    impl = comm._impl
    if comm.rank == 0:
        with pytest.raises(col.CollectiveTimeoutError, match="did not complete"):
            comm.all_reduce(x, async_op=True).synchronize()
        assert impl.comm is None and impl.failure is not None
        deadline = time.monotonic() + 10
        while impl._in_flight and time.monotonic() < deadline:
            time.sleep(0.05)
        assert impl._in_flight == []  # released: the aborted kernel has left the stream
        with pytest.raises(col.CollectivesError, match="unusable after an earlier error"):
            comm.all_reduce(x)  # the front end was told: the communicator is dead
        comm.abort()
    else:
        time.sleep(4.0)  # never joins rank 0's second all_reduce
        comm.abort()


def test_a_failed_issue_is_in_flight_while_issued_and_gone_after(nccl):
    """Defects 3 and 10: a call is in flight before NCCL is called (a host-side hang is
    timed); one that raises is removed, and CuPy's KeyError for code 8 is a
    CollectivesError that leaves the communicator healthy."""
    import cupy

    impl = nccl._impl
    x = cupy.ones(2)
    seen = []

    def issue(stream):
        seen.append(len(impl._in_flight))
        raise KeyError(8)  # what CuPy raises for ncclTimeout, which it cannot name

    before = len(impl._in_flight)
    with pytest.raises(col.CollectivesError, match="ncclTimeout"):
        impl._launch("all_reduce", (x,), issue)
    assert seen == [before + 1] and len(impl._in_flight) == before
    assert impl.failure is None
    nccl.all_reduce(x)
    assert x.get().tolist() == [float(nccl.size)] * 2


@needs_nccl
def test_auto_falls_back_to_mpi_where_ranks_share_a_gpu_nccl_cannot_share(monkeypatch):
    """Defect 4: the decision is shared_gpu_reason's, on every rank alike, and said."""
    import warnings

    monkeypatch.delenv("COLLECTIVES_BACKEND", raising=False)

    from mpi4py import MPI

    from collectives._nccl.backend import placement
    from collectives._nccl.rules import shared_gpu_reason

    world = MPI.COMM_WORLD
    local = world.Split_type(MPI.COMM_TYPE_SHARED)
    device = local.Get_rank() % __import__("cupy").cuda.runtime.getDeviceCount()
    local.Free()
    found = world.allgather(placement(device))
    why = shared_gpu_reason([f[:4] for f in found], min(f[4] for f in found))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        comm = col.init(backend="auto", timeout=60)
    try:
        assert comm.backend == ("nccl" if why is None else "mpi")
        said = [w for w in caught if issubclass(w.category, col.BackendFallbackWarning)]
        assert bool(said) == (why is not None and comm.rank == 0)
    finally:
        comm.close()
    if why is not None:
        with pytest.raises(col.BackendUnavailableError, match="cannot run here"):
            col.init(backend="nccl", timeout=60)


def test_streams_and_events_are_on_the_communicators_device(nccl):
    """Defect 5: another device current at the call changes nothing."""
    import cupy

    assert nccl.stream.device_id == nccl.device
    count = cupy.cuda.runtime.getDeviceCount()
    if count < 2:
        pytest.skip("needs a second visible GPU")
    x = cupy.ones(8, cupy.float32)
    with cupy.cuda.Device((nccl.device + 1) % count):
        work = nccl.all_reduce(x, async_op=True)
        work.wait()
    assert x.get().tolist() == [float(nccl.size)] * 8


def test_dp_and_tp_calls_in_flight_together_on_a_mesh(nccl):
    """Async DP reductions and TP calls in flight together, each communicator on a stream of
    its own, each call ordered after the caller's stream: every result is right."""
    import cupy

    size = nccl.size
    tp = 2 if size % 2 == 0 else 1
    mesh = col.DeviceMesh(nccl, {"dp": size // tp, "tp": tp})
    try:
        dp, tpc = mesh["dp"], mesh["tp"]
        assert len({id(dp.stream), id(tpc.stream), id(nccl.stream)}) == 3
        grads = [cupy.full(1 << 20, 1.0, cupy.float32) for _ in range(4)]
        works = []
        for i, g in enumerate(grads):
            works.append(dp.all_reduce(g, async_op=True))
            act = cupy.full(1 << 16, float(i), cupy.float32)
            tpc.all_reduce(act)  # a TP call while DP reductions are still in flight
            assert float(act[0].get()) == float(i * tp)
        for w in works:
            w.wait()
        for g in grads:
            assert float(g[-1].get()) == float(size // tp)
    finally:
        mesh.close()


def test_split_drains_first_and_falls_back_without_comm_split(nccl, monkeypatch):
    """Defect 7: work in flight is finished before the split; where ncclCommSplit is
    missing a fresh communicator is made over the child's MPI communicator."""
    import cupy

    from collectives._nccl.backend import NcclBackend

    x = cupy.ones(1 << 22, cupy.float32)
    work = nccl.all_reduce(x, async_op=True)
    half = nccl.split(nccl.rank % 2)
    assert work.is_completed()
    y = cupy.ones(2)
    half.all_reduce(y)
    assert y.get().tolist() == [float(half.size)] * 2
    half.close()
    monkeypatch.setattr(NcclBackend, "_can_split", lambda self: False)
    fresh = nccl.split(0, key=-nccl.rank)  # one color, ranks reversed
    z = cupy.full(2, float(fresh.rank))
    fresh.all_reduce(z)
    assert fresh.rank == nccl.size - 1 - nccl.rank
    assert z.get().tolist() == [float(sum(range(nccl.size)))] * 2
    fresh.close()


def test_ddp_bucket_ends_come_from_each_works_completion(nccl):
    """Defect 8: each bucket's end is its own reduction's end, not the last bucket's."""
    import cupy

    from ddp import DistributedDataParallel

    params = {f"w{i}": cupy.zeros(1 << 22, cupy.float32) for i in range(3)}
    model = DistributedDataParallel(params, nccl, bucket_cap_mb=16, first_bucket_cap_mb=16)
    assert len(model.buckets) >= 2
    for name in reversed(list(params)):
        model.grads[name][...] = 1
        model.mark_ready(name)
    model.finish()
    ends = [b.end_s for b in model.stats.buckets]
    assert all(e == e for e in ends)  # measured, not NaN
    assert ends == sorted(ends) and ends[0] < ends[-1]


def test_sync_calls_complete_in_the_flight_recorder_and_events_have_no_timing(nccl):
    """Defect 10."""
    import cupy

    x = cupy.ones(4)
    nccl.all_reduce(x)
    cupy.cuda.get_current_stream().synchronize()
    assert nccl.flight_record()[-1]["state"] == "completed"
    work = nccl.all_reduce(x, async_op=True)
    work.synchronize()
    event = work.event
    assert event is not None and nccl.xp is cupy
    with pytest.raises(cupy.cuda.runtime.CUDARuntimeError):
        cupy.cuda.get_elapsed_time(event, event)  # cudaEventDisableTiming


def test_close_during_a_timeout_aborts_once_and_releases_the_arrays_after_the_drain(nccl):
    """close() holds the communicator while the watchdog finds the call overdue: the
    watchdog's failure aborts nothing and stops nothing; close() sees it, aborts, and the
    arrays go only once what was queued before the abort has left the stream."""
    import cupy

    if nccl.size < 2:
        pytest.skip("needs a peer that does not arrive")
    comm = init_with_short_timeout("nccl", 2.0)
    impl = comm._impl
    if comm.rank == 0:
        x = cupy.ones(1024, cupy.float32)
        comm.all_reduce(x, async_op=True)  # rank 1 never joins
        start = time.monotonic()
        comm.close()
        assert time.monotonic() - start < 30
        assert impl.comm is None and impl._drained is not None
        impl._watchdog.join(30)
        assert not impl._watchdog.is_alive()
        assert impl._in_flight == []
    else:
        time.sleep(4.0)
        comm.abort()


def test_an_exception_in_the_watchdog_fails_the_communicator_and_ends_the_thread(nccl):
    import cupy

    comm = col.init(backend="nccl", timeout=60)
    impl = comm._impl

    def broken():
        raise ValueError("broken check")

    impl._check = broken
    impl._watchdog.join(10)
    assert not impl._watchdog.is_alive()  # it failed the backend, aborted and released
    assert isinstance(impl.failure, col.CollectivesError)
    assert "watchdog" in str(impl.failure) and "broken check" in str(impl.failure)
    with pytest.raises(col.CollectivesError, match="broken check"):
        comm.all_reduce(cupy.ones(2))
    comm.abort()


def test_an_error_from_comm_split_raises_on_every_rank_without_a_fallback(nccl):
    """Where every rank can split, an error from ncclCommSplit is this rank's error: no
    fallback that would leave the other ranks inside ncclCommSplit."""
    impl = nccl._impl
    if not impl._can_split():
        pytest.skip("this CuPy or NCCL has no ncclCommSplit")

    class NoSplit:
        def __init__(self, comm):
            self.comm = comm

        def commSplit(self, color, key):
            raise RuntimeError("ncclCommSplit is not available in this version")

        def __getattr__(self, name):
            return getattr(self.comm, name)

    real = impl.comm
    impl.comm = NoSplit(real)
    try:
        with pytest.raises(col.CollectivesError, match="split: .*not available"):
            nccl.split(0)
    finally:
        impl.comm = real
    nccl.barrier()


def test_event_done_says_true_once_an_event_completes(nccl):
    import cupy

    from collectives._nccl.backend import _event_done

    event = nccl.stream.record(cupy.cuda.Event(disable_timing=True))
    nccl.stream.synchronize()
    assert _event_done(event) is True


def test_a_failure_after_the_nccl_call_is_enqueued_keeps_the_arrays_and_fails(nccl, monkeypatch):
    """The reduction is on the stream (every rank's, so the peers complete it) when the
    division of the AVG fallback raises: the call stays in flight until the stream passes
    it, and the communicator fails."""
    import cupy

    import collectives._numerics

    def broken(out, size):
        raise MemoryError("no memory for the division")

    comm = col.init(backend="nccl", timeout=60)
    impl = comm._impl
    monkeypatch.setattr(impl, "has_avg", False)
    monkeypatch.setattr(collectives._numerics, "divide_in_place", broken)
    x = cupy.ones(1 << 20, cupy.float32)
    with pytest.raises(col.CollectivesError, match="all_reduce: .*no memory for the division"):
        comm.all_reduce(x, op="avg")
    assert impl.failure is not None and impl.comm is None  # aborted once the call left NCCL
    impl._watchdog.join(30)
    assert not impl._watchdog.is_alive() and impl._in_flight == []
    with pytest.raises(col.CollectivesError, match="unusable after an earlier error"):
        comm.all_reduce(x)
    comm.abort()


def test_close_inside_another_communicators_group_is_refused(nccl):
    import cupy

    other = col.init(backend="nccl", timeout=60)
    with nccl.group():
        with pytest.raises(col.CommunicatorStateError, match="close: inside comm.group"):
            other.close()
    x = cupy.ones(2)
    other.all_reduce(x)  # still open
    assert x.get().tolist() == [float(other.size)] * 2
    other.close()


def test_a_call_while_a_cuda_graph_is_captured_is_refused_before_anything_is_issued(nccl):
    import cupy

    x = cupy.ones(4, cupy.float32)
    doubled = cupy.zeros_like(x)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        stream.begin_capture()
        try:
            cupy.multiply(x, 2, out=doubled)  # captured, not run
            with pytest.raises(col.InvalidArgumentError, match="capturing a CUDA graph"):
                nccl.all_reduce(x)
            with pytest.raises(col.InvalidArgumentError, match="capturing a CUDA graph"):
                nccl.barrier()
        finally:
            graph = stream.end_capture()
        graph.launch()
        stream.synchronize()
    np.testing.assert_array_equal(doubled.get(), np.full(4, 2.0, np.float32))
    nccl.all_reduce(x)  # nothing was issued: the communicator works as before
    np.testing.assert_array_equal(x.get(), np.full(4, nccl.size, np.float32))


def test_a_stuck_call_on_one_communicator_never_holds_up_another(nccl):
    """Each communicator issues on a stream of its own: while a call on one never completes
    (its peer never joins), another communicator's calls go on, and only the stuck one's
    watchdog fires."""
    import cupy
    from mpi4py import MPI

    if nccl.size < 2:
        pytest.skip("needs a peer that does not join")
    stuck = init_with_short_timeout("nccl", 3.0)
    other = col.init("nccl", timeout=60)  # healthy: a loaded machine must not time it out
    try:
        x = cupy.ones(4, cupy.float32)
        work = stuck.all_reduce(x, async_op=True) if nccl.rank == 0 else None  # rank 1 never joins
        y = cupy.ones(8, cupy.float32)
        for _ in range(3):
            other.all_reduce(y, async_op=True).synchronize()
        assert y.get().tolist() == [float(nccl.size**3)] * 8
        if work is not None:
            with pytest.raises(col.CollectiveTimeoutError, match="did not complete"):
                work.synchronize()
        other.all_reduce(y)  # healthy still
        other.barrier()
    finally:
        MPI.COMM_WORLD.Barrier()
        stuck.abort()
        other.close()


@pytest.mark.parametrize("op", ["max", "min"])
@pytest.mark.parametrize("verb", ["all_reduce", "reduce", "reduce_scatter"])
def test_max_and_min_propagate_nan_on_every_rank_as_numpy(nccl, op, verb):
    """NCCL's fmaxf/fminf let a number win over a NaN; NumPy and the MPI backend propagate it:
    every rank gets NumPy's result, whichever rank held the NaN."""
    import cupy
    from mpi4py import MPI

    size, rank = nccl.size, nccl.rank
    ufunc = np.maximum if op == "max" else np.minimum
    rows = [np.array([1.0, 2.0, -3.0, 4.0] * size, np.float32) + r for r in range(size)]
    for r, row in enumerate(rows):
        row[r % 4] = np.nan  # each rank a NaN somewhere else; the last place none
    expected = ufunc.reduce(np.stack(rows))
    x = cupy.asarray(rows[rank])
    if verb == "all_reduce":
        got = nccl.all_reduce(x, op=op).get()
    elif verb == "reduce":
        out = nccl.reduce(x, root=size - 1, op=op)
        got = out.get() if rank == size - 1 else expected
    else:
        got = nccl.reduce_scatter(x.reshape(size, 4), op=op).get()
        expected = expected.reshape(size, 4)[rank]
    np.testing.assert_array_equal(got, expected)
    everyone = MPI.COMM_WORLD.allgather(got.tobytes() if verb == "all_reduce" else b"")
    assert len(set(everyone)) == 1
