"""``col.hierarchical``: every result equals the flat collective's, on the backend under test.

Nodes of 2 ranks (``COLLECTIVES_RANKS_PER_NODE=2``): at 4 ranks 2 x 2, so counts that 2 does
not divide are padded and blocks are reordered; at 3 ranks a node of 2 and a node of 1, whose
rank carries both slots across nodes.
"""

from __future__ import annotations

import numpy as np
import pytest

import collectives as col
from collectives import InvalidArgumentError
from ddp import DistributedDataParallel

WORLD_SIZES = (3, 4)
SPMD_TIMEOUT = 180

INTEGERS = ("int8", "uint8", "int32", "uint32", "int64", "uint64")
FLOATS = ("float16", "float32", "float64")
COMPLEX = ("complex64", "complex128")
OPS = ("sum", "prod", "max", "min", "avg")


def host(a) -> np.ndarray:
    return a.get() if hasattr(a, "get") else np.asarray(a)


@pytest.fixture
def hcomm(comm, monkeypatch):
    monkeypatch.setenv("COLLECTIVES_RANKS_PER_NODE", "2")
    view = col.hierarchical(comm)
    yield view
    view.close()


def data(xp, dtype: str, shape, rank: int, seed: int = 0):
    """Small values whose sums, products and averages are exact in every dtype; signed
    ones include negatives (so integer avg truncates toward zero)."""
    n = int(np.prod(shape))
    values = (np.arange(n) * 7 + rank * 3 + seed) % 5
    if dtype.startswith(("int", "float", "complex")):
        values = values - 2
    array = values.astype(dtype).reshape(shape)
    if dtype.startswith("complex"):
        array = array + 1j * array[::-1] if array.ndim else array
    return xp.asarray(array)


def test_nodes_follow_ranks_per_node(hcomm):
    node, local = divmod(hcomm.rank, 2)
    assert (hcomm.node, hcomm.local_rank, hcomm.nodes) == (node, local, (hcomm.size + 1) // 2)
    assert hcomm.local_size == hcomm.intra.size == min(2, hcomm.size - 2 * node)
    assert hcomm.inter.size == hcomm.nodes  # the carriers of this rank's slot, one per node
    # the rank alone on its node carries both slots
    assert hcomm.layout.served == ([0, 1] if hcomm.local_size == 1 else [local])
    nodes = "2 nodes of 2 ranks" if hcomm.size == 4 else "2 nodes of 2 or 1 ranks"
    assert hcomm.described == nodes and nodes in repr(hcomm) and nodes in hcomm.call_path


def test_all_reduce_equals_flat_for_every_dtype_and_op(comm, hcomm, xp):
    for dtype in INTEGERS + FLOATS + COMPLEX:
        for op in OPS if dtype not in COMPLEX else ("sum", "avg"):
            # 7: padded to 8 at 2 ranks per node; 8 and out of place: no padding
            x = data(xp, dtype, (7,), comm.rank)
            expected = host(comm.all_reduce(x.copy(), op))
            got = hcomm.all_reduce(x, op)
            assert got is x
            np.testing.assert_array_equal(host(x), expected, err_msg=f"{dtype} {op}")
            y = data(xp, dtype, (2, 4), comm.rank, seed=1)
            out = xp.zeros_like(y)
            hcomm.all_reduce(y, op, out=out)
            np.testing.assert_array_equal(host(out), host(comm.all_reduce(y, op)), f"{dtype} {op}")


def test_float_sum_within_the_documented_bound(comm, hcomm, xp):
    rng = np.random.default_rng(comm.rank)
    for dtype, u in (("float32", 2.0**-24), ("float64", 2.0**-53)):
        x = xp.asarray(rng.standard_normal(1001).astype(dtype) * 1e3)
        flat = host(comm.all_reduce(x, out=xp.empty_like(x)))
        mine = host(hcomm.all_reduce(x, out=xp.empty_like(x)))
        magnitude = host(comm.all_reduce(xp.abs(x)))
        bound = 2 * (comm.size - 1) * u * magnitude.astype(np.float64)
        assert np.all(np.abs(mine.astype(np.float64) - flat) <= bound), dtype


def test_reduce_scatter_and_all_gather_equal_flat(comm, hcomm, xp):
    n = comm.size
    for dtype in ("int8", "uint32", "int64", "float16", "float64", "complex64"):
        ops = ("sum", "avg") if dtype.startswith("complex") else OPS
        for op in ops:
            x = data(xp, dtype, (n, 3), comm.rank)
            expected = host(comm.reduce_scatter(x, op))
            np.testing.assert_array_equal(host(hcomm.reduce_scatter(x, op)), expected, op)
            inplace = x.copy()  # the in-place form: out is x[rank]
            hcomm.reduce_scatter(inplace, op, out=inplace[comm.rank])
            np.testing.assert_array_equal(host(inplace[comm.rank]), expected, op)
        y = data(xp, dtype, (2, 2), comm.rank)
        expected = host(comm.all_gather(y))
        np.testing.assert_array_equal(host(hcomm.all_gather(y)), expected, dtype)
        out = xp.zeros((n, 2, 2), dtype)
        out[comm.rank] = y
        hcomm.all_gather(out[comm.rank], out=out)  # the in-place form
        np.testing.assert_array_equal(host(out), expected, dtype)


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
def test_float16_avg_near_its_max_does_not_overflow(comm, hcomm, xp, async_op):
    # each rank's 60000 (float16's largest is 65504): a sum overflows, the mean is exact; on
    # equal nodes each step averages, on unequal ones (3 ranks) the sum runs in float32
    def done(result, work):
        if async_op:
            work.wait()
        return host(result)

    for shape, out_of_place in (((7,), False), ((2, 4), True)):  # padded, and not
        x = xp.full(shape, 60000.0, np.float16)
        out = xp.zeros_like(x) if out_of_place else x
        work = hcomm.all_reduce(x, "avg", out=out, async_op=async_op)
        np.testing.assert_array_equal(done(out, work), np.float16(60000.0), str(shape))
    x = xp.full((comm.size, 3), 60000.0, np.float16)
    out = xp.zeros(3, np.float16)
    work = hcomm.reduce_scatter(x, "avg", out=out, async_op=async_op)
    np.testing.assert_array_equal(done(out, work), np.float16(60000.0))
    work = hcomm.reduce_scatter(x, "avg", out=x[comm.rank], async_op=async_op)  # in place
    np.testing.assert_array_equal(done(x[comm.rank], work), np.float16(60000.0))


def test_bfloat16(comm, hcomm, xp):
    bits = xp.asarray((np.arange(5, dtype=np.float32) + comm.rank).view(np.uint32) >> 16)
    bits = bits.astype(np.uint16)
    expected = host(comm.all_reduce(col.as_bfloat16(bits.copy())))
    got = bits.copy()
    hcomm.all_reduce(col.as_bfloat16(got))
    np.testing.assert_array_equal(host(got), expected)


def test_async_calls_in_flight_together(comm, hcomm, xp):
    n = comm.size
    a = data(xp, "float32", (5,), comm.rank)
    b = data(xp, "int32", (n, 2), comm.rank)
    c = data(xp, "float64", (3,), comm.rank)
    want = (
        host(comm.all_reduce(a.copy(), "avg")),
        host(comm.reduce_scatter(b, "sum")),
        host(comm.all_gather(c)),
        host(comm.all_reduce(b.copy(), "avg")),
    )
    works = [
        hcomm.all_reduce(a, "avg", async_op=True),
        hcomm.reduce_scatter(b, "sum", async_op=True),
        hcomm.all_gather(c, async_op=True),
        hcomm.all_reduce(b.copy(), "avg", async_op=True),  # integer avg: divided after
    ]
    # the event DDP times buckets by: NCCL issues every step at once, MPI has none
    for work in works:
        assert (work.event is None) == (hcomm.backend != "nccl")
    results = [works[0].wait(), works[1].wait(), works[2].synchronize(), works[3].wait()]
    for work, result, expected in zip(works, results, want):
        assert work.is_completed() and work.result is result
        np.testing.assert_array_equal(host(result), expected)


def test_other_verbs_pass_through(comm, hcomm, xp):
    x = xp.full(3, float(comm.rank))
    hcomm.broadcast(x, root=comm.size - 1)
    assert host(x).tolist() == [comm.size - 1.0] * 3
    hcomm.barrier()
    y = data(xp, "float64", (comm.size, 2), comm.rank)
    np.testing.assert_array_equal(host(hcomm.all_to_all(y)), host(comm.all_to_all(y)))
    with hcomm.group():
        hcomm.send(x, (comm.rank + 1) % comm.size)
        hcomm.recv(xp.empty_like(x), (comm.rank - 1) % comm.size)
    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    got = hcomm.sendrecv(xp.full(2, float(comm.rank)), right, source=left)
    assert host(got).tolist() == [float(left)] * 2


def test_bad_input_is_refused_before_communicating(comm, hcomm, xp):
    x = xp.zeros(4, np.float32)
    with pytest.raises(
        InvalidArgumentError, match=r"all_reduce: out has shape \(3,\), expected \(4,\)"
    ):
        hcomm.all_reduce(x, out=xp.zeros(3, np.float32))
    with pytest.raises(InvalidArgumentError, match="reduce_scatter: x has shape"):
        hcomm.reduce_scatter(xp.zeros((comm.size + 1, 2)))
    with pytest.raises(InvalidArgumentError, match="all_gather: out has shape"):
        hcomm.all_gather(x, out=xp.zeros((comm.size, 5), np.float32))
    with pytest.raises(InvalidArgumentError, match="op max is not defined for complex64"):
        hcomm.all_reduce(xp.zeros(2, np.complex64), "max")
    with hcomm.group(), pytest.raises(InvalidArgumentError, match="cannot run inside comm.group"):
        hcomm.all_reduce(x)
    hcomm.all_reduce(x)  # the communicators are still in step


def test_ddp_through_the_view_equals_flat(comm, hcomm, xp):
    shapes = {"a.w": (5, 3), "a.b": (3,), "b.w": (3, 2)}
    results = []
    for c in (comm, hcomm):
        params = {k: xp.zeros(s, np.float64) for k, s in shapes.items()}
        model = DistributedDataParallel(
            params, comm=c, bucket_cap_mb=1e-4, first_bucket_cap_mb=1e-4
        )
        assert len(model.buckets) > 1
        model.weight = (comm.rank + 1) / (comm.size * (comm.size + 1) / 2)
        for i, name in enumerate(reversed(list(shapes))):
            model.grads[name][...] = xp.asarray(data(np, "float64", shapes[name], comm.rank, i))
            model.mark_ready(name)
        model.finish()
        results.append({k: host(g) for k, g in model.grads.items()})
    for name in shapes:
        np.testing.assert_allclose(results[1][name], results[0][name], rtol=1e-12, atol=1e-12)


def test_bad_ranks_per_node_is_refused_before_communicating(comm, monkeypatch):
    with pytest.raises(InvalidArgumentError, match="ranks_per_node must be a positive int"):
        col.hierarchical(comm, ranks_per_node=0)
    monkeypatch.setenv("COLLECTIVES_RANKS_PER_NODE", "two")
    with pytest.raises(InvalidArgumentError, match="COLLECTIVES_RANKS_PER_NODE must be"):
        col.hierarchical(comm)
    with pytest.raises(InvalidArgumentError, match="comm must be a Communicator"):
        col.hierarchical(object())
    comm.barrier()  # nothing was communicated: the communicator is usable and in step


def test_a_node_of_one_and_one_of_three(comm, xp):
    if comm.size != 4:
        pytest.skip("nodes of 3 and 1 need 4 ranks")
    with col.hierarchical(comm, ranks_per_node=3) as view:
        assert view.layout.served == ([0, 1, 2] if comm.rank == 3 else [comm.rank])
        for dtype, op in (("int32", "avg"), ("float64", "max"), ("int8", "sum")):
            x = data(xp, dtype, (7,), comm.rank)
            want = host(comm.all_reduce(x.copy(), op))
            np.testing.assert_array_equal(host(view.all_reduce(x.copy(), op)), want, dtype)
            y = data(xp, dtype, (comm.size, 3), comm.rank)
            want = host(comm.reduce_scatter(y, op))
            np.testing.assert_array_equal(host(view.reduce_scatter(y, op)), want, dtype)
            np.testing.assert_array_equal(host(view.all_gather(x)), host(comm.all_gather(x)))


def test_nodes_from_the_shared_memory_split(comm, xp, monkeypatch):
    monkeypatch.delenv("COLLECTIVES_RANKS_PER_NODE", raising=False)
    with col.hierarchical(comm) as view:  # one machine: one node of every rank
        assert (view.nodes, view.local_size) == (1, comm.size)
        x = data(xp, "int64", (5,), comm.rank)
        np.testing.assert_array_equal(host(view.all_reduce(x.copy())), host(comm.all_reduce(x)))
    with pytest.raises(col.CommunicatorStateError, match="closed"):
        view.all_reduce(x)
