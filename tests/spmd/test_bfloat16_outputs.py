"""Arrays of ml_dtypes' bfloat16 come back as bfloat16 from every call, not as their uint16
bits: the arrays a call allocates take the caller's dtype, and a call that writes into the
caller's array returns that very array. ``as_bfloat16`` callers still get uint16 bits."""

from __future__ import annotations

import numpy as np
import pytest

import collectives as col

SHARED_COMM = True  # COLLECTIVES_TEST_REUSE_COMM=1 may give every test one communicator

ml_dtypes = pytest.importorskip("ml_dtypes")

WORLD_SIZES = (2,)

pytestmark = pytest.mark.numpy_only(reason="ml_dtypes' bfloat16 is a NumPy dtype")

BF16 = np.dtype(ml_dtypes.bfloat16)


def rows(comm: col.Communicator, rank: int) -> np.ndarray:
    """Shape (size, 3): row j holds 10 * rank + j + 0.5, exact in bfloat16."""
    values = 10.0 * rank + np.arange(comm.size)[:, None] + np.array([0.5, 1.5, 2.5])
    return values.astype(BF16)


def test_arrays_the_call_allocates_are_bfloat16(comm):
    rank, size = comm.rank, comm.size
    x = rows(comm, rank)
    every = np.stack([rows(comm, r) for r in range(size)])  # every[r] is rank r's x

    gathered = comm.all_gather(x[0])
    assert gathered.dtype == BF16
    np.testing.assert_array_equal(gathered, every[:, 0])

    reduced = comm.reduce_scatter(x)
    assert reduced.dtype == BF16
    np.testing.assert_array_equal(reduced, every[:, rank].astype(np.float32).sum(axis=0))

    exchanged = comm.all_to_all(x)
    assert exchanged.dtype == BF16
    np.testing.assert_array_equal(exchanged, every[:, rank])

    on_root = comm.gather(x[0], root=1)
    if rank == 1:
        assert on_root.dtype == BF16
        np.testing.assert_array_equal(on_root, every[:, 0])
    else:
        assert on_root is None

    part = comm.scatter(x, root=0)  # x is only read on root; elsewhere it gives the shape
    assert part.dtype == BF16
    np.testing.assert_array_equal(part, every[0, rank])

    waited = comm.all_gather(x[1], async_op=True).wait()
    assert waited.dtype == BF16
    np.testing.assert_array_equal(waited, every[:, 1])


def test_calls_that_write_into_the_callers_array_return_it(comm):
    rank, size = comm.rank, comm.size
    x = np.full(3, rank + 1, BF16)
    assert comm.all_reduce(x) is x
    np.testing.assert_array_equal(x, np.full(3, size * (size + 1) / 2, np.float32))

    out = np.zeros((size, 3), BF16)
    assert comm.all_gather(x, out=out) is out
    assert comm.all_gather(out[rank], out=out) is out  # the in-place form
    assert comm.broadcast(x, root=0) is x
    assert comm.all_reduce(x, out=np.zeros(3, BF16)).dtype == BF16

    peer = (rank + 1) % size
    received = np.zeros(3, BF16)
    with comm.group():
        comm.send(np.full(3, rank, BF16), peer)
        assert comm.recv(received, (rank - 1) % size) is received
    np.testing.assert_array_equal(received, np.full(3, (rank - 1) % size, np.float32))


def test_as_bfloat16_bits_stay_uint16(comm):
    bits = np.full(3, comm.rank + 1, BF16).view(np.uint16)
    gathered = comm.all_gather(col.as_bfloat16(bits))
    assert gathered.dtype == np.uint16
    np.testing.assert_array_equal(gathered.view(BF16)[:, 0], np.arange(1, comm.size + 1))
    assert comm.all_reduce(col.as_bfloat16(bits)) is bits
