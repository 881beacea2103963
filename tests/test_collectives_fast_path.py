"""The per-call fast paths must reject exactly what the general checks reject (world size 1)."""

from __future__ import annotations

import numpy as np
import pytest

import collectives as col
from collectives import _books, _progress


@pytest.fixture(scope="module")
def comm():
    c = col.init(backend="mpi")
    yield c
    c.close()


def test_non_native_byte_order_is_rejected(comm):
    # The fast dtype lookup keys on dtype.char, which is the same for '>f4' and '<f4'.
    big = np.ones(3, ">f4")
    with pytest.raises(col.InvalidArgumentError, match=r"x has dtype >f4, expected one of"):
        comm.all_reduce(big)
    with pytest.raises(col.InvalidArgumentError, match=r"out has dtype >f4, expected one of"):
        comm.all_reduce(np.ones(3, np.float32), out=big)


@pytest.mark.parametrize(
    "out, message",
    [
        (np.zeros(5), r"out has shape \(5,\), expected \(4,\)"),
        (np.zeros(4, np.float32), "out has dtype float32, expected float64"),
        (np.zeros(8)[::2], r"out must be C-contiguous, got strides \(16,\)"),
    ],
)
def test_out_fast_path_keeps_every_check(comm, out, message):
    with pytest.raises(col.InvalidArgumentError, match=message):
        comm.all_reduce(np.ones(4), out=out)


def test_out_sharing_memory_goes_through_the_exact_check(comm):
    buf = np.arange(8.0)
    with pytest.raises(col.InvalidArgumentError, match="overlaps x without being the same memory"):
        comm.all_reduce(buf[0:4], out=buf[2:6])
    same = buf[0:4]
    assert comm.all_reduce(same, out=buf[0:4]) is same  # the same memory: in place
    np.testing.assert_array_equal(buf, np.arange(8.0))


def test_wait_yields_early_only_when_ranks_outnumber_cores(comm):
    # One rank on this node: never more ranks than cores, so polls stay busy for 10 ms.
    assert comm.local_size == 1
    assert comm.yield_after == 1e-2


@pytest.mark.parametrize(
    "mine, node, shares",
    [
        ({0, 1}, [{0, 1}, {0, 1}], False),  # two ranks free on two CPUs
        ({0, 1}, [{0, 1}] * 4, True),  # four ranks on two CPUs
        ({0}, [{0}, {1}], False),  # each pinned to a CPU of its own (Intel MPI's default)
        ({0}, [{0}, {0}, {1}, {1}], True),  # two pinned to each CPU
        ({0}, [{0}, {0}, {1, 2, 3}], True),  # another rank pinned to this one's CPU
        ({1, 2, 3}, [{0}, {0}, {1, 2, 3}], False),  # but this one has CPUs of its own
    ],
)
def test_a_rank_shares_a_core_when_pinned_or_outnumbering(mine, node, shares):
    node = [frozenset(cpus) for cpus in node]
    assert _progress.shares_a_core(frozenset(mine), node) is shares


def test_each_ranks_board_words_sit_on_cache_lines_of_their_own(comm):
    # every call writes this rank's words: two ranks' words on one line (or on the pair of
    # lines CPUs fetch together) cost 0.1-0.2 us a call in line transfers (benchmarks/README.md)
    board = comm._progress
    apart = (board.first_word(1) - board.first_word(0)) * 8
    assert apart >= 128 and apart % 128 == 0
    assert board.first_word(0) * 8 + 4 * 8 <= board._area(0) < board._area(0) + 128 <= apart
    first = board.first_word(board.local_rank)
    comm.all_reduce(np.ones(2))
    assert board.words[first + _progress.NUMBER] == board.slots[board.local_rank] > 0
    assert comm._books.slots[comm._books.slot] == board.slots[board.local_rank]
    board.waiting("all_reduce (shape (2,), float64)")  # the area lies past the words
    assert board.words[first + _progress.NUMBER] == board.slots[board.local_rank]
    assert board.words[first + _progress.INSIDE] == board.inside[board.local_rank] == 0
    board.done_waiting()


def test_ml_dtypes_bfloat16_is_reduced_as_bfloat16(comm):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    x = np.array([1.0, 2.5, -3.0], ml_dtypes.bfloat16)
    out = np.zeros(3, ml_dtypes.bfloat16)
    comm.all_reduce(x, out=out)
    np.testing.assert_array_equal(out.astype(np.float32), [1.0, 2.5, -3.0])
    comm.all_reduce(x, op="max")  # in place, through the float32 path
    np.testing.assert_array_equal(x.astype(np.float32), [1.0, 2.5, -3.0])


class _DLPackOnly:
    """An array object that offers only the DLPack protocol (as PyTorch and JAX arrays do)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def test_dlpack_objects_are_taken_zero_copy(comm):
    backing = np.arange(4.0)
    result = comm.all_reduce(_DLPackOnly(backing), op="max")
    assert np.shares_memory(result, backing)
    out = np.zeros(4)
    comm.all_gather(_DLPackOnly(backing), out=out.reshape(1, 4))
    np.testing.assert_array_equal(out, backing)


def test_torch_tensors_are_taken_zero_copy(comm):
    torch = pytest.importorskip("torch")
    t = torch.arange(4, dtype=torch.float32)
    out = torch.zeros(4)
    comm.all_reduce(t, out=out)  # world size 1: the sum is t, written into out's memory
    assert out.tolist() == [0.0, 1.0, 2.0, 3.0]
    assert np.shares_memory(comm.all_reduce(t), t.numpy())  # in place
    assert np.shares_memory(comm.broadcast(t), t.numpy())


@pytest.mark.parametrize("op", ["SUM", 0, None, ["sum"]])
def test_direct_path_leaves_odd_ops_to_the_checked_path(comm, op):
    # "SUM" is accepted (case-insensitive); the rest are refused, and none may slip through.
    x = np.ones(2)
    if op == "SUM":
        np.testing.assert_array_equal(comm.all_reduce(x, op), [1.0, 1.0])
    else:
        with pytest.raises(col.InvalidArgumentError, match="op must be one of"):
            comm.all_reduce(x, op)


@pytest.mark.parametrize("root", [1, -1, 0.0, True])
def test_direct_broadcast_checks_the_root(comm, root):
    with pytest.raises(
        col.InvalidArgumentError, match=r"broadcast: root must be an int in \[0, 1\)"
    ):
        comm.broadcast(np.ones(2), root)


def test_direct_calls_are_recorded_and_numbered(comm):
    start = len(comm.flight_record())
    x = np.ones((2, 3), np.int32)
    comm.all_reduce(x, out=np.empty_like(x))
    comm.broadcast(x)
    comm.all_reduce(np.ones(0))  # an empty array works
    record = comm.flight_record()[start:]
    assert [(c["call"], c["nbytes"], c["shape"], c["state"]) for c in record] == [
        ("all_reduce", 24, (2, 3), "completed"),
        ("broadcast", 24, (2, 3), "completed"),
        ("all_reduce", 0, (0,), "completed"),
    ]
    seqs = [c["seq"] for c in record]
    assert seqs == list(range(seqs[0], seqs[0] + 3))


def test_direct_calls_are_held_inside_a_group_and_refused_after_close():
    c = col.init(backend="mpi")
    with c.group():  # the call is held until the block ends
        x = np.ones(2)
        c.all_reduce(x)
        assert c.flight_record()[-1]["state"] == "started"
    assert c.flight_record()[-1]["state"] == "completed"
    c.all_reduce(x)  # after the group the direct path again: its record is an Entry
    assert type(c.recorder[-1]) is _books.Entry
    c.close()
    with pytest.raises(col.CommunicatorStateError, match="all_reduce: communicator is closed"):
        c.all_reduce(np.ones(2))
