"""A world of size 1 without a launcher, and the errors ``col.init`` raises (in-process)."""

from __future__ import annotations

import functools

import numpy as np
import pytest

import collectives as col


@pytest.fixture
def comm():
    c = col.init(backend="mpi", timeout=30)
    yield c
    c.close()


def test_world_of_one(comm):
    assert (comm.rank, comm.size) == (0, 1)
    assert (comm.local_rank, comm.local_size) == (0, 1)
    assert comm.backend == "mpi" and comm.device is None and comm.stream is None
    assert comm.mpi_comm.Get_size() == 1


def test_every_verb_at_size_one(comm):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    ref = x.copy()
    for op in ("sum", "prod", "max", "min", "avg"):
        y = x.copy()
        assert comm.all_reduce(y, op=op) is y
        np.testing.assert_array_equal(y, ref)
        out = np.empty_like(x)
        assert comm.reduce(x, 0, op, out=out) is out
        np.testing.assert_array_equal(out, ref)
        rs = comm.reduce_scatter(x[None], op=op)
        np.testing.assert_array_equal(rs, ref)
    assert comm.broadcast(x, 0) is x
    np.testing.assert_array_equal(comm.all_gather(x), ref[None])
    np.testing.assert_array_equal(comm.all_to_all(x[None]), ref[None])
    np.testing.assert_array_equal(comm.gather(x, 0), ref[None])
    np.testing.assert_array_equal(comm.scatter(x[None], 0), ref)
    y = np.zeros_like(x)
    with comm.group():
        comm.send(x, 0)
        comm.recv(y, 0)
    np.testing.assert_array_equal(y, ref)
    assert comm.barrier() is None
    work = comm.all_reduce(x.copy(), op="avg", async_op=True)
    assert isinstance(work, col.Work)
    np.testing.assert_array_equal(work.wait(), ref)
    assert work.is_completed()


@pytest.mark.parametrize("verb", ["all_gather", "gather", "reduce_scatter", "scatter"])
def test_slot_verbs_take_out_apart_or_in_place_and_refuse_an_overlap(comm, verb):
    """The verbs whose in-place form has one array be the rank's slot of the other: an ``out``
    apart from ``x`` (its own memory, or a view of memory x does not reach) is written and
    handed back, the slot itself is the in-place form, and any other overlap is refused."""
    gathers = verb in ("all_gather", "gather")
    call = getattr(comm, verb)
    root = () if verb in ("all_gather", "reduce_scatter") else (0,)

    def run(x, out):
        return call(x, *root, out=out)

    part = np.arange(3.0)
    want = part[None] if gathers else part
    # apart: an array of its own, and a view of a buffer x does not reach
    for out in (np.empty_like(want), np.empty(2 * want.size)[want.size :].reshape(want.shape)):
        assert run(part if gathers else part[None], out) is out
        np.testing.assert_array_equal(out, want)
    # in place: x is out[0] (gathers) or out is x[0]
    whole = part[None].copy()
    x, out = (whole[0], whole) if gathers else (whole, whole[0])
    assert run(x, out) is out
    np.testing.assert_array_equal(whole[0], part)
    # overlapping, but not the slot
    flat = np.arange(4.0)
    x, out = (flat[1:4], flat[0:3][None]) if gathers else (flat[0:3][None], flat[1:4])
    with pytest.raises(col.InvalidArgumentError, match="overlaps"):
        run(x, out)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "float16"])
@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("count", [6, 1 << 15])  # also past COUNTED_FROM (64 KiB a rank)
def test_in_place_reduce_scatter_at_size_one(comm, dtype, async_op, count):
    # x[0] is the rank's slot: the in-place form (of either call form, counted or not), which
    # alone moves nothing and leaves x as it was
    for op in ("sum", "prod", "max", "min", "avg"):
        x = (np.arange(count) % 7 + 1).astype(dtype).reshape(1, 2, count // 2)
        ref, mine = x.copy(), x[0]
        result = comm.reduce_scatter(x, op=op, out=mine, async_op=async_op)
        if async_op:
            result = result.wait()
        assert result is mine
        np.testing.assert_array_equal(x, ref)


def test_int_avg_and_bfloat16_at_size_one(comm):
    x = np.array([-3, 3, 7], np.int32)
    np.testing.assert_array_equal(comm.all_reduce(x, op="avg"), [-3, 3, 7])
    bits = np.array([0x3F80, 0xC040], np.uint16)  # 1.0, -3.0
    comm.all_reduce(col.as_bfloat16(bits), op="sum")
    np.testing.assert_array_equal(bits, [0x3F80, 0xC040])


def test_init_twice_gives_independent_communicators():
    with col.init(backend="mpi") as a, col.init(backend="mpi") as b:
        assert a is not b and a.mpi_comm != b.mpi_comm
        assert a.size == b.size == 1
    assert a.closed and b.closed


@pytest.mark.parametrize("backend", ["gloo", "MPI", "", None, 1])
def test_init_rejects_bad_backend(backend):
    with pytest.raises(col.InvalidArgumentError) as info:
        col.init(backend=backend)
    message = str(info.value)
    assert message.startswith("init: backend must be one of auto, nccl, mpi")
    assert repr(backend) in message


@pytest.mark.parametrize("timeout", [0, -1, "10", None, float("nan")])
def test_init_rejects_bad_timeout(timeout):
    with pytest.raises(col.InvalidArgumentError) as info:
        col.init(backend="mpi", timeout=timeout)
    assert str(info.value).startswith("init: timeout must be a positive number of seconds")
    assert repr(timeout) in str(info.value)


@pytest.mark.parametrize("device", [-1, "0", 1.0])
def test_init_rejects_bad_device(device):
    with pytest.raises(col.InvalidArgumentError, match=r"^init: device must be"):
        col.init(backend="mpi", device=device)


def test_init_rejects_bad_environment_backend(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_BACKEND", "tcp")
    with pytest.raises(col.InvalidArgumentError, match="COLLECTIVES_BACKEND.*'tcp'"):
        col.init()


def test_auto_backend_follows_environment(monkeypatch):
    monkeypatch.setenv("COLLECTIVES_BACKEND", "mpi")
    with col.init() as comm:
        assert comm.backend == "mpi"


@functools.cache
def _nccl_refusal() -> str | None:
    """What ``col.init("nccl")`` says on this machine where it refuses (None: NCCL runs)."""
    try:
        comm = col.init(backend="nccl", timeout=30)
    except col.BackendUnavailableError as e:
        return str(e)
    comm.close()
    return None


@pytest.mark.skipif(_nccl_refusal() is None, reason="NCCL is available on this machine")
def test_nccl_unavailable_is_a_clear_error():
    with pytest.raises(col.BackendUnavailableError) as info:
        col.init(backend="nccl")
    message = str(info.value)
    prefix = "init: backend 'nccl' is unavailable on rank 0: "
    assert message.startswith(prefix)
    why = message[len(prefix) :]
    assert len(why) > 10 and ("CuPy" in why or "CUDA" in why), why  # what is missing
    assert message == _nccl_refusal()  # the same every time


@pytest.mark.skipif(_nccl_refusal() is None, reason="NCCL is available on this machine")
def test_auto_falls_back_to_mpi_without_nccl(monkeypatch):
    monkeypatch.delenv("COLLECTIVES_BACKEND", raising=False)
    with col.init(backend="auto") as comm:
        assert comm.backend == "mpi"


def test_calls_are_numbered_and_recorded_whatever_their_form(comm):
    assert comm.timeout == 30.0 and comm.xp is np
    x = np.ones(3, np.float32)
    comm.all_reduce(x, async_op=True).wait()
    comm.broadcast(x)
    with comm.group():
        comm.all_reduce(x)
    assert [(e["seq"], e["call"], e["state"]) for e in comm.flight_record()] == [
        (1, "all_reduce", "completed"),
        (2, "broadcast", "completed"),
        (3, "all_reduce", "completed"),
    ]


@pytest.mark.parametrize("async_op", [False, True])
def test_in_place_calls_at_size_one_keep_their_input_and_are_recorded(comm, async_op):
    """Alone, a call in place (and broadcast) moves nothing: MPI is not called, and the result
    is the input, in its own array, every call numbered and recorded as any other."""
    g = np.arange(6.0).reshape(1, 6)
    y = g[0].copy()
    calls = [
        ("all_reduce", lambda: comm.all_reduce(y, op="avg", async_op=async_op), y),
        ("reduce", lambda: comm.reduce(y, 0, "max", async_op=async_op), y),
        ("broadcast", lambda: comm.broadcast(y, async_op=async_op), y),
        ("all_gather", lambda: comm.all_gather(g[0], out=g, async_op=async_op), g),
        ("reduce_scatter", lambda: comm.reduce_scatter(g, out=g[0], async_op=async_op), None),
        ("all_to_all", lambda: comm.all_to_all(g, out=g, async_op=async_op), g),
        ("gather", lambda: comm.gather(g[0], 0, out=g, async_op=async_op), g),
        ("scatter", lambda: comm.scatter(g, 0, out=g[0], async_op=async_op), None),
    ]
    before = len(comm.flight_record())
    for name, call, same in calls:
        result = call()
        if async_op:
            result = result.wait()
        if same is not None:
            assert result is same, name
        np.testing.assert_array_equal(y, np.arange(6.0))
        np.testing.assert_array_equal(g, np.arange(6.0)[None])
    record = comm.flight_record()[before:]
    assert [(e["call"], e["state"]) for e in record] == [(n, "completed") for n, _, _ in calls]
