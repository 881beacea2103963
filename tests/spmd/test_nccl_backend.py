"""The NCCL backend on CuPy arrays (skipped where there is no GPU or no NCCL).

At world size 2 this needs two GPUs, or one GPU with NCCL >= 2.30.3 and
``NCCL_MULTI_RANK_GPU_ENABLE=1`` (the ``nccl_world`` fixture of conftest.py skips otherwise).
"""

from __future__ import annotations

import numpy as np
import pytest

import collectives as col

WORLD_SIZES = (1, 2)


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
