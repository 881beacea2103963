"""Tensor-parallel region mappings: forward values and the adjoint identity of every pair."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import InvalidArgumentError
from ddp.sharded import shard_ranges
from ddp.tensor_parallel import (
    MAPPINGS,
    copy_to_group,
    gather_from_group,
    gather_from_sequence,
    reduce_from_group,
    reduce_scatter_to_sequence,
    scatter_to_group,
    scatter_to_sequence,
)

SHARED_COMM = True  # COLLECTIVES_TEST_REUSE_COMM=1 may give every test one communicator

WORLD_SIZES = (1, 2, 4)

# The axis each mapping splits (None: it splits nothing).
AXIS = {
    copy_to_group: None,
    reduce_from_group: None,
    scatter_to_group: -1,
    gather_from_group: -1,
    scatter_to_sequence: 0,
    gather_from_sequence: 0,
    reduce_scatter_to_sequence: 0,
}
IDS = [m.__name__ for m in MAPPINGS]


def full_shape(size: int, pad: bool) -> tuple[int, int, int]:
    n = 2 * size + (1 if pad else 0)
    return (n, 3, n)


def block(x: np.ndarray, axis: int, size: int, rank: int) -> np.ndarray:
    start, stop = shard_ranges(x.shape[axis], size)[rank]
    return np.take(x, np.arange(start, stop), axis=axis)


def value(kind: str, shape, axis, size: int, rank: int, seed: int) -> np.ndarray:
    """Rank ``rank``'s part of a random value of ``kind`` with global ``shape``."""
    if kind == "replicated":
        return np.random.default_rng(seed).standard_normal(shape)
    x = np.random.default_rng(seed + 1 + rank).standard_normal(shape)
    return block(x, axis, size, rank) if kind == "sharded" else x


def inner(a, b, kind: str, comm, xp) -> float:
    """The inner product of two values of ``kind``: replicated counted once, else summed."""
    local = xp.asarray([float(xp.vdot(a.ravel(), b.ravel()))])
    if kind != "replicated":
        comm.all_reduce(local, op="sum")
    return float(local[0])


def reference_forward(mapping, parts: list[np.ndarray], size: int, rank: int) -> np.ndarray:
    """What ``mapping.forward`` must give on ``rank`` when rank r passed ``parts[r]``."""
    axis = AXIS[mapping]
    if mapping is copy_to_group:
        return parts[rank]
    if mapping is reduce_from_group:
        return sum(parts)
    if mapping in (scatter_to_group, scatter_to_sequence):
        return block(parts[rank], axis, size, rank)
    if mapping in (gather_from_group, gather_from_sequence):
        return np.concatenate(parts, axis=axis)
    return block(sum(parts), axis, size, rank)  # reduce_scatter_to_sequence


@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("mapping", list(MAPPINGS), ids=IDS)
def test_forward_matches_reference(comm, xp, mapping, pad):
    in_kind, _ = MAPPINGS[mapping]
    shape, axis = full_shape(comm.size, pad), AXIS[mapping]
    parts = [value(in_kind, shape, axis, comm.size, r, 10) for r in range(comm.size)]
    y = mapping.forward(xp.asarray(parts[comm.rank]), comm, pad=pad)
    expected = reference_forward(mapping, parts, comm.size, comm.rank)
    assert y.shape == expected.shape
    np.testing.assert_allclose(xp.asnumpy(y) if xp is not np else y, expected, rtol=1e-13)


@pytest.mark.parametrize("pad", [False, True])
@pytest.mark.parametrize("mapping", list(MAPPINGS), ids=IDS)
def test_adjoint_identity(comm, xp, mapping, pad):
    """<forward(x), y> == <x, backward(y)>, each inner product over the whole group."""
    in_kind, out_kind = MAPPINGS[mapping]
    shape, axis = full_shape(comm.size, pad), AXIS[mapping]
    x = xp.asarray(value(in_kind, shape, axis, comm.size, comm.rank, 20))
    fx = mapping.forward(x, comm, pad=pad)
    y = xp.asarray(value(out_kind, shape, axis, comm.size, comm.rank, 40))
    assert y.shape == fx.shape
    by = mapping.backward(y, comm, pad=pad)
    assert by.shape == x.shape
    lhs = inner(fx, y, out_kind, comm, xp)
    rhs = inner(x, by, in_kind, comm, xp)
    assert lhs == pytest.approx(rhs, rel=1e-12, abs=1e-12)
    assert abs(lhs) > 1e-3  # a zero map would pass the identity trivially


@pytest.mark.parametrize(
    "call",
    [
        lambda x, comm: scatter_to_group.forward(x, comm),
        lambda x, comm: gather_from_group.backward(x, comm),
        lambda x, comm: scatter_to_sequence.forward(x, comm),
        lambda x, comm: reduce_scatter_to_sequence.forward(x, comm),
        lambda x, comm: gather_from_sequence.backward(x, comm),
    ],
    ids=[
        "scatter_to_group",
        "gather_from_group",
        "scatter_seq",
        "reduce_scatter_seq",
        "gather_seq",
    ],
)
def test_uneven_split_without_pad_is_an_error(comm, xp, call):
    if comm.size == 1:
        pytest.skip("every length divides into one block")
    x = xp.ones((2 * comm.size + 1, 3, 2 * comm.size + 1))
    with pytest.raises(InvalidArgumentError, match="expected a multiple of the group size"):
        call(x, comm)


def test_padded_gather_rejects_blocks_out_of_order(comm, xp):
    if comm.size == 1:
        pytest.skip("one block is always in order")
    # array_split puts the longer blocks first; here the last rank holds the extra row.
    rows = 2 if comm.rank == comm.size - 1 else 1
    with pytest.raises(InvalidArgumentError, match="numpy.array_split order"):
        gather_from_sequence.forward(xp.ones((rows, 2)), comm, pad=True)


def test_each_mapping_documents_forward_and_backward():
    for mapping in MAPPINGS:
        doc = mapping.__doc__
        assert doc.count("\n") == 0 and "forward:" in doc and "backward:" in doc, doc
