"""nccl-tests' element counts and bandwidth formulas (in-process)."""

from __future__ import annotations

import pytest

from benchmarks._busbw import OPS, algbw_bytes, bandwidths, bus_factor, counts, row_bytes
from collectives import InvalidArgumentError

# written out by hand from nccl-tests' *GetBw functions, for n = 4 ranks
FACTOR_4 = {
    "all_reduce": 1.5, "reduce": 1.0, "broadcast": 1.0, "sendrecv": 1.0, "all_gather": 0.75,
    "reduce_scatter": 0.75, "all_to_all": 0.75, "gather": 0.75, "scatter": 0.75,
    "hypercube": 1.0,
}  # fmt: skip
# algbw's bytes over count * itemsize, for n = 4: per-rank counts times n; hypercube n - 1
BYTES_4 = {"all_gather": 4, "reduce_scatter": 4, "all_to_all": 4, "gather": 4, "scatter": 4,
           "hypercube": 3}  # fmt: skip


@pytest.mark.parametrize("op", OPS)
def test_bus_factor(op):
    assert bus_factor(op, 4) == FACTOR_4[op]
    assert bus_factor(op, 1) == (1.0 if FACTOR_4[op] == 1.0 else 0.0)


def test_bus_factor_all_reduce_two_ranks():
    assert bus_factor("all_reduce", 2) == 1.0
    assert bus_factor("all_reduce", 8) == 1.75


@pytest.mark.parametrize(
    "op,expected",
    [("all_reduce", (256, 256, 256)), ("reduce", (256, 256, 256)),
     ("broadcast", (256, 256, 256)), ("sendrecv", (256, 256, 256)),
     ("all_gather", (64, 64, 256)), ("gather", (64, 64, 256)),
     ("reduce_scatter", (64, 256, 64)), ("scatter", (64, 256, 64)),
     ("all_to_all", (64, 256, 256)), ("hypercube", (64, 64, 256))],
)  # fmt: skip
def test_counts(op, expected):
    c = counts(op, 1024, 4, 4)
    assert (c.count, c.send, c.recv) == expected
    assert row_bytes(c, 4) == 1024


def test_counts_round_down():
    # 100 bytes of float32 = 25 elements; 6 per rank on 4 ranks, trimmed to whole 16-byte
    # blocks as nccl-tests' GetCollByteCount: 4 per rank; the row says 64 bytes
    c = counts("all_gather", 100, 4, 4)
    assert (c.count, c.recv, row_bytes(c, 4)) == (4, 16, 64)
    assert counts("all_reduce", 7, 4, 2).count == 1
    # the example of nccl-tests at 3 ranks: 64 bytes of float is "48 4", not "60 5"
    for op in ("all_gather", "reduce_scatter", "all_to_all", "gather", "scatter", "hypercube"):
        c = counts(op, 64, 4, 3)
        assert (row_bytes(c, 4), c.count) == (48, 4), op
        # (count / nranks) & ~(16 / eltSize - 1), written out for 1-, 2- and 8-byte types
        assert counts(op, 1000, 1, 3).count == (1000 // 3) & ~15
        assert counts(op, 1000, 2, 3).count == (500 // 3) & ~7
        assert counts(op, 1000, 8, 3).count == (125 // 3) & ~1
    assert counts("hypercube", 24, 1, 2).count == 0  # size 0, count 0: a row all the same


@pytest.mark.parametrize("op", OPS)
def test_bandwidths(op):
    times = BYTES_4.get(op, 1)
    assert algbw_bytes(op, 100, 8, 4) == 800 * times
    algbw, busbw = bandwidths(op, 1000, 4, 4, 2e-6)
    assert algbw == pytest.approx(4000 * times / 2e-6 / 1e9)
    assert busbw == pytest.approx(algbw * FACTOR_4[op])
    assert bandwidths(op, 1000, 4, 4, 0.0) == (0.0, 0.0)


def test_unknown_op_and_size():
    with pytest.raises(InvalidArgumentError, match=r"counts: op must be one of .* got 'allreduce'"):
        counts("allreduce", 8, 4, 2)
    with pytest.raises(InvalidArgumentError, match=r"bus_factor: op must be one of"):
        bus_factor("bcast", 2)
    with pytest.raises(InvalidArgumentError, match=r"algbw_bytes: op must be one of"):
        algbw_bytes("bcast", 1, 1, 2)
    with pytest.raises(InvalidArgumentError, match=r"bus_factor: size must be >= 1, got 0"):
        bus_factor("all_reduce", 0)
