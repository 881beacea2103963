"""Vocab-parallel embedding and cross-entropy against their unsharded forms, in float64."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import InvalidArgumentError
from ddp.tensor_parallel import (
    VocabParallelCrossEntropy,
    VocabParallelEmbedding,
    vocab_parallel_cross_entropy,
)

SHARED_COMM = True  # COLLECTIVES_TEST_REUSE_COMM=1 may give every test one communicator

WORLD_SIZES = (1, 2, 4)
DIM = 3


def host(a):
    return a.get() if hasattr(a, "get") else a


@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_embedding_equals_table_lookup(comm, xp, sequence_parallel):
    size, rank = comm.size, comm.rank
    vocab = 3 * size
    rng = np.random.default_rng(0)
    table = rng.standard_normal((vocab, DIM))
    ids = rng.integers(0, vocab, size=(2 * size, 5))
    ids[0, :2] = vocab - 1  # repeated ids must add up in the gradient
    dy = rng.standard_normal((2 * size, 5, DIM))
    grad_ref = np.zeros_like(table)
    np.add.at(grad_ref, ids, dy)

    emb = VocabParallelEmbedding(xp.asarray(table), comm, sequence_parallel=sequence_parallel)
    rows = slice(2 * rank, 2 * rank + 2) if sequence_parallel else slice(None)
    out = emb.forward(xp.asarray(ids))
    np.testing.assert_allclose(host(out), table[ids][rows], rtol=1e-14)
    assert emb.backward(xp.asarray(dy[rows])) is None
    np.testing.assert_allclose(host(emb.grad_weight), grad_ref[3 * rank : 3 * rank + 3])


def cross_entropy_reference(logits, target, dloss):
    shifted = logits - logits.max(-1, keepdims=True)
    logsumexp = np.log(np.exp(shifted).sum(-1))
    loss = logsumexp - np.take_along_axis(shifted, target[..., None], -1)[..., 0]
    softmax = np.exp(shifted - logsumexp[..., None])
    onehot = np.eye(logits.shape[-1])[target]
    return loss, (softmax - onehot) * dloss[..., None]


@pytest.mark.parametrize("offset", [0.0, 1000.0])
def test_cross_entropy_equals_unsharded(comm, xp, offset):
    """Loss and gradient without gathering the logits; large logits must not overflow."""
    size, rank = comm.size, comm.rank
    k = 3
    rng = np.random.default_rng(1)
    logits = rng.standard_normal((2, 4, k * size)) * 3 + offset
    target = rng.integers(0, k * size, size=(2, 4))
    dloss = rng.standard_normal((2, 4))
    loss_ref, grad_ref = cross_entropy_reference(logits, target, dloss)

    ce = VocabParallelCrossEntropy(comm)
    cols = slice(rank * k, (rank + 1) * k)
    loss = ce.forward(xp.asarray(logits[..., cols]), xp.asarray(target))
    np.testing.assert_allclose(host(loss), loss_ref, rtol=1e-12)
    np.testing.assert_allclose(
        host(ce.backward(xp.asarray(dloss))), grad_ref[..., cols], atol=1e-12
    )


def test_mean_cross_entropy_function(comm, xp):
    size, rank = comm.size, comm.rank
    rng = np.random.default_rng(2)
    logits = rng.standard_normal((6, 2 * size))
    target = rng.integers(0, 2 * size, size=6)
    loss_ref, grad_ref = cross_entropy_reference(logits, target, np.full(6, 1 / 6))
    loss, dlogits = vocab_parallel_cross_entropy(
        xp.asarray(logits[:, 2 * rank : 2 * rank + 2]), xp.asarray(target), comm
    )
    assert float(loss) == pytest.approx(loss_ref.mean(), rel=1e-12)
    np.testing.assert_allclose(host(dlogits), grad_ref[:, 2 * rank : 2 * rank + 2], atol=1e-14)


def test_vocab_errors(comm, xp):
    size = comm.size
    ce = VocabParallelCrossEntropy(comm)
    with pytest.raises(InvalidArgumentError, match=r"target has shape \(3,\), expected \(4,\)"):
        ce.forward(xp.zeros((4, 2)), xp.zeros(3, dtype=np.int64))
    with pytest.raises(InvalidArgumentError, match=r"ids must be in \[0, "):
        ce.forward(xp.zeros((1, 2)), xp.array([2 * size]))
    with pytest.raises(InvalidArgumentError, match="expected forward"):
        ce.backward(xp.ones(1))
    logits = xp.zeros((4, 2))
    ce.forward(logits, xp.zeros(4, dtype=np.int64), microbatch=7)
    with pytest.raises(InvalidArgumentError, match=r"dloss has shape \(3,\), expected \(4,\)"):
        ce.backward(xp.ones(3), 7)
    assert ce.backward(xp.ones(4), 7).shape == logits.shape  # the refused call kept the state
    emb = VocabParallelEmbedding(xp.zeros((2 * size, DIM)), comm)
    with pytest.raises(InvalidArgumentError, match="expected an integer dtype"):
        emb.forward(xp.zeros(3))
    with pytest.raises(InvalidArgumentError, match=r"ids must be in \[0, "):
        emb.forward(xp.array([-1]))
    with pytest.raises(InvalidArgumentError, match=r"expected \(vocab, dim\)"):
        VocabParallelEmbedding(xp.zeros(4), comm)
    if size > 1:
        with pytest.raises(InvalidArgumentError, match="vocab .* multiple of the group size"):
            VocabParallelEmbedding(xp.zeros((2 * size + 1, DIM)), comm)
