"""Tensor-parallel layers with microbatches in flight and split backward, alone and as the
stages of zero-bubble and V pipeline schedules, against the unsharded model in float64."""

from __future__ import annotations

import numpy as np
import pytest

import collectives as col
import pipeline
from collectives import InvalidArgumentError
from ddp.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelCrossEntropy,
    VocabParallelEmbedding,
)
from pipeline import schedules

SHARED_COMM = True  # COLLECTIVES_TEST_REUSE_COMM=1 may give every test one communicator

WORLD_SIZES = (1, 2, 4)
SPMD_TIMEOUT = 120
WIDTH, ROWS = 4, 3


def host(a):
    return a.get() if hasattr(a, "get") else a


def block_reference(x, w1, b1, w2, b2, dy):
    """relu(x @ w1 + b1) @ w2 + b2: output, dx and the four gradients."""
    h = x @ w1 + b1
    a = np.maximum(h, 0)
    dh = (dy @ w2.T) * (h > 0)
    grads = [x.T @ dh, dh.sum(0), a.T @ dy, dy.sum(0)]
    return a @ w2 + b2, dh @ w1.T, grads


def test_microbatches_in_flight_and_split_backward(comm, xp):
    """Three microbatches forward, then backward out of order, some split with their
    weight half later: dx per microbatch and the summed gradients are the unsharded ones."""
    rng = np.random.default_rng(3)
    hidden = 2 * comm.size
    w1, b1 = rng.standard_normal((WIDTH, hidden)), rng.standard_normal(hidden)
    w2, b2 = rng.standard_normal((hidden, WIDTH)), rng.standard_normal(WIDTH)
    fc1 = ColumnParallelLinear(xp.asarray(w1), xp.asarray(b1), comm)
    fc2 = RowParallelLinear(xp.asarray(w2), xp.asarray(b2), comm)
    xs = [rng.standard_normal((ROWS, WIDTH)) for _ in range(3)]
    dys = [rng.standard_normal((ROWS, WIDTH)) for _ in range(3)]
    hs = {}
    for mb, x in enumerate(xs):
        hs[mb] = fc1.forward(xp.asarray(x), mb)
        y = fc2.forward(xp.maximum(hs[mb], 0), mb)
        np.testing.assert_allclose(host(y), block_reference(x, w1, b1, w2, b2, dys[mb])[0])
    for mb in (2, 0, 1):
        split = mb != 0
        dh = fc2.backward(xp.asarray(dys[mb]), mb, split=split) * (hs[mb] > 0)
        dx = fc1.backward(dh, mb, split=split)
        np.testing.assert_allclose(host(dx), block_reference(xs[mb], w1, b1, w2, b2, dys[mb])[1])
    for mb in (1, 2):
        fc2.backward_weight(mb)
        fc1.backward_weight(mb)
    want = [sum(g) for g in zip(*(block_reference(*a)[2] for a in zip(
        xs, [w1] * 3, [b1] * 3, [w2] * 3, [b2] * 3, dys)))]  # fmt: skip
    k, r = hidden // comm.size, comm.rank
    got = [fc1.grad_weight, fc1.grad_bias, fc2.grad_weight, fc2.grad_bias]
    shards = [want[0][:, r * k : (r + 1) * k], want[1][r * k : (r + 1) * k], want[2][r * k : (r + 1) * k], want[3]]  # fmt: skip
    for g, w in zip(got, shards):
        np.testing.assert_allclose(host(g), w, rtol=1e-12, atol=1e-12)
    bound = fc1.grad_weight
    fc1.zero_grad()  # in place: an array bound as grad_weight stays bound
    assert fc1.grad_weight is bound and not host(bound).any() and not host(fc1.grad_bias).any()
    with pytest.raises(InvalidArgumentError, match="no saved input for microbatch 7"):
        fc1.backward(xp.ones((ROWS, k)), 7)
    with pytest.raises(InvalidArgumentError, match="nothing deferred for microbatch 0"):
        fc2.backward_weight(0)


def test_vocab_layers_keyed_by_microbatch(comm, xp):
    vocab, dim = 2 * comm.size, 3
    rng = np.random.default_rng(5)
    table = rng.standard_normal((vocab, dim))
    emb = VocabParallelEmbedding(xp.asarray(table), comm)
    ids = [rng.integers(0, vocab, (2, 3)) for _ in range(2)]
    dys = [rng.standard_normal((2, 3, dim)) for _ in range(2)]
    for mb in (0, 1):
        np.testing.assert_allclose(host(emb.forward(xp.asarray(ids[mb]), mb)), table[ids[mb]])
    emb.backward(xp.asarray(dys[1]), 1, split=True)
    emb.backward(xp.asarray(dys[0]), 0)
    emb.backward_weight(1)
    want = np.zeros_like(table)
    for i, dy in zip(ids, dys):
        np.add.at(want, i.reshape(-1), dy.reshape(-1, dim))
    k = vocab // comm.size
    np.testing.assert_allclose(host(emb.grad_weight), want[comm.rank * k : (comm.rank + 1) * k])
    ce = VocabParallelCrossEntropy(comm)
    logits = [rng.standard_normal((2, vocab)) for _ in range(2)]
    targets = [rng.integers(0, vocab, 2) for _ in range(2)]
    for mb in (0, 1):
        local = logits[mb][:, comm.rank * k : (comm.rank + 1) * k]
        ce.forward(xp.asarray(local), xp.asarray(targets[mb]), mb)
    for mb in (1, 0):
        grad = host(ce.backward(xp.ones(2), mb))
        z = logits[mb] - logits[mb].max(-1, keepdims=True)
        soft = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
        soft[np.arange(2), targets[mb]] -= 1
        np.testing.assert_allclose(grad, soft[:, comm.rank * k : (comm.rank + 1) * k])


SCHEDULES = {
    "zb-h1": lambda p, m: schedules.zero_bubble(p, m),
    "interleaved-zb": lambda p, m: schedules.interleaved_zero_bubble(p, m, 2),
    "zb-v": lambda p, m: schedules.zero_bubble_v(p, m),
    "dualpipe-v": lambda p, m: schedules.dualpipe_v(p, m, order="paper"),
}


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_tensor_parallel_stages_in_a_pipeline(comm, xp, name):
    """pp x tp: each model stage is a column-then-row block sharded over tp; losses and
    every gradient equal the unsharded model's."""
    pp_size = 2 if comm.size > 1 else 1
    mesh = col.DeviceMesh(comm, {"pp": pp_size, "tp": comm.size // pp_size})
    pp, tp = mesh["pp"], mesh["tp"]
    m = 2 * pp_size
    schedule = SCHEDULES[name](pp_size, m)
    rng = np.random.default_rng(7)
    hidden = 2 * tp.size
    blocks = [
        (rng.standard_normal((WIDTH, hidden)) / 2, rng.standard_normal(hidden),
         rng.standard_normal((hidden, WIDTH)) / 2, rng.standard_normal(WIDTH))
        for _ in range(schedule.stages)
    ]  # fmt: skip
    xs = [rng.standard_normal((ROWS, WIDTH)) for _ in range(m)]
    ts = [rng.standard_normal((ROWS, WIDTH)) for _ in range(m)]

    # the unsharded model: blocks one after the other, mean-square loss over microbatches
    want_losses, want = [], [[0.0] * 4 for _ in blocks]
    for x, t in zip(xs, ts):
        acts = [x]
        for w1, b1, w2, b2 in blocks:
            acts.append(block_reference(acts[-1], w1, b1, w2, b2, np.zeros((ROWS, WIDTH)))[0])
        dy = (acts[-1] - t) / (m * ROWS)
        want_losses.append(0.5 * float(((acts[-1] - t) ** 2).sum()) / (m * ROWS))
        for s in reversed(range(len(blocks))):
            _, dy_in, grads = block_reference(acts[s], *blocks[s], dy)
            want[s] = [a + g for a, g in zip(want[s], grads)]
            dy = dy_in

    layers, stages = {}, []
    for chunk in range(schedule.chunks):
        s = schedule.stage_of(pp.rank, chunk)
        w1, b1, w2, b2 = (xp.asarray(a) for a in blocks[s])
        fc1, fc2 = ColumnParallelLinear(w1, b1, tp), RowParallelLinear(w2, b2, tp)
        layers[s] = (fc1, fc2)
        stages.append(_stage(fc1, fc2, xp))

    def loss_fn(y, t):
        diff = y - t
        return 0.5 * (diff * diff).sum() / (m * ROWS), diff / (m * ROWS)

    last = schedule.place(schedule.stages - 1)[0]
    losses = pipeline.run(
        schedule,
        pp,
        stages,
        inputs=[xp.asarray(x) for x in xs] if pp.rank == 0 else None,
        targets=[xp.asarray(t) for t in ts] if pp.rank == last else None,
        loss_fn=loss_fn,
    )
    if pp.rank == last:
        np.testing.assert_allclose([float(v) for v in losses], want_losses, rtol=1e-12)
    k, r = hidden // tp.size, tp.rank
    for s, (fc1, fc2) in layers.items():
        got = [fc1.grad_weight, fc1.grad_bias, fc2.grad_weight, fc2.grad_bias]
        w = want[s]
        shards = [w[0][:, r * k : (r + 1) * k], w[1][r * k : (r + 1) * k], w[2][r * k : (r + 1) * k], w[3]]  # fmt: skip
        for g, expected in zip(got, shards):
            np.testing.assert_allclose(host(g), expected, rtol=1e-10, atol=1e-13)
    mesh.close()


def _stage(fc1, fc2, xp):
    """One column-relu-row block as a pipeline stage, weight gradients split off."""
    hidden = {}

    def forward(x, mb):
        hidden[mb] = fc1.forward(x, mb)
        return fc2.forward(xp.maximum(hidden[mb], 0), mb)

    def backward(dy, mb):
        dh = fc2.backward(dy, mb, split=True) * (hidden.pop(mb) > 0)
        return fc1.backward(dh, mb, split=True)

    def backward_weight(mb):
        fc2.backward_weight(mb)
        fc1.backward_weight(mb)

    return pipeline.Stage(forward, backward, backward_weight)
