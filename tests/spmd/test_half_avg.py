"""AVG of float16 does not overflow where the mean is in range, on every backend: NCCL's avg
divides before summing, and the MPI backend sums in float32, divides, then rounds (a sum in
float16 would pass 65504 first). ``ddp.hooks.allreduce`` relies on it on any backend."""

from __future__ import annotations

import numpy as np
import pytest

SHARED_COMM = True  # COLLECTIVES_TEST_REUSE_COMM=1 may give every test one communicator

WORLD_SIZES = (2, 3)
SPMD_TIMEOUT = 120

#: near float16's largest finite value (65504), and a multiple of its spacing there (32):
#: every rank's sum of it is past float16's range, their mean is exact
NEAR_MAX = 60000.0


def host(a) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy array."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


@pytest.mark.parametrize("async_op", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("in_place", [False, True], ids=["out", "inplace"])
def test_all_reduce_avg_of_float16_near_its_max(comm, xp, in_place, async_op):
    for count in (1, 7, 4096):  # one element, a few, and more than the few of a short call
        x = xp.full(count, NEAR_MAX, xp.float16)
        out = x if in_place else xp.zeros(count, xp.float16)
        work = comm.all_reduce(x, op="avg", out=out, async_op=async_op)
        if async_op:
            work.wait()
        got = host(out)
        assert got.dtype == np.float16
        assert np.isfinite(got).all(), got[:4]
        np.testing.assert_array_equal(got, np.float16(NEAR_MAX))


def test_all_reduce_avg_of_float16_rounds_the_mean_of_each_rank(comm, xp):
    # ranks hold different values: the mean of their exact sum, rounded once to float16
    values = [NEAR_MAX - 32.0 * 7 * r for r in range(comm.size)]
    x = xp.full(5, values[comm.rank], xp.float16)
    comm.all_reduce(x, op="avg")
    want = np.float64(sum(values)) / comm.size
    got = host(x)
    assert np.isfinite(got).all(), got
    # one rounding on MPI (exact here); NCCL's premultiplied terms may round once more
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2**-10)


def test_reduce_avg_of_float16_near_its_max(comm, xp):
    x = xp.full(64, NEAR_MAX, xp.float16)
    out = xp.zeros(64, xp.float16)
    comm.reduce(x, root=0, op="avg", out=out)
    if comm.rank == 0:
        np.testing.assert_array_equal(host(out), np.float16(NEAR_MAX))


@pytest.mark.parametrize("count", [3, 1 << 15], ids=["small", "large"])
def test_reduce_scatter_avg_of_float16_near_its_max(comm, xp, count):
    # the large one passes the sizes kept as persistent requests: two ranks exchange there
    x = xp.full((comm.size, count), NEAR_MAX, xp.float16)
    out = xp.zeros(count, xp.float16)
    comm.reduce_scatter(x, op="avg", out=out)
    np.testing.assert_array_equal(host(out), np.float16(NEAR_MAX))


def test_a_float16_sum_past_its_range_is_still_an_infinity(comm, xp):
    # only AVG goes through float32: a sum keeps float16's arithmetic (and its overflow)
    x = xp.full(4, NEAR_MAX, xp.float16)
    comm.all_reduce(x, op="sum")
    assert np.isinf(host(x)).all()
