"""pipeline.run against the unsplit model: same losses and every gradient, each schedule.

Stages hold arrays of the backend under test (``xp``); the references run in NumPy."""

from __future__ import annotations

import numpy as np
import pytest

import collectives as col
import pipeline
from pipeline import schedules
from pipeline.mlp import Chain, Dense, init_weights, mse

SHARED_COMM = True  # COLLECTIVES_TEST_REUSE_COMM=1 may give every test one communicator

WORLD_SIZES = (2, 4)
SPMD_TIMEOUT = 120
WIDTH, ROWS = 5, 3


def reference(weights, xs, ts, scale):
    """Losses and summed gradients of the whole tanh MLP (no tanh on the last layer)."""
    grads = [(np.zeros_like(w), np.zeros_like(b)) for w, b in weights]
    losses = []
    for x, t in zip(xs, ts):
        acts = [x]
        for i, (w, b) in enumerate(weights):
            z = acts[-1] @ w + b
            acts.append(z if i == len(weights) - 1 else np.tanh(z))
        diff = acts[-1] - t
        losses.append(scale * 0.5 * float((diff * diff).sum()) / len(x))
        dy = diff * (scale / len(x))
        for i in reversed(range(len(weights))):
            dz = dy if i == len(weights) - 1 else dy * (1 - acts[i + 1] ** 2)
            grads[i][0][...] += acts[i].T @ dz
            grads[i][1][...] += dz.sum(axis=0)
            dy = dz @ weights[i][0].T
    return losses, grads


def data(microbatches, seed=1):
    rng = np.random.default_rng(seed)
    xs = [rng.standard_normal((ROWS, WIDTH)) for _ in range(microbatches)]
    ts = [rng.standard_normal((ROWS, WIDTH)) for _ in range(microbatches)]
    return xs, ts


def build(schedule, rank, weights, xp, split):
    """This rank's layers (one Dense per model stage) and Stages, chunk by chunk."""
    last = schedule.stages - 1
    layers, stages = {}, []
    for chunk in range(schedule.chunks):
        s = schedule.stage_of(rank, chunk)
        w, b = weights[s]
        layers[s] = Dense(xp.asarray(w), xp.asarray(b), activation=None if s == last else "tanh")
        stages.append(Chain([layers[s]]).stage(split=split))
    return layers, stages


SCHEDULES = {
    "gpipe": lambda p, m: schedules.gpipe(p, m),
    "1f1b": lambda p, m: schedules.one_f_one_b(p, m),
    "interleaved-2": lambda p, m: schedules.interleaved_1f1b(p, m, 2),
    "zb-h1": lambda p, m: schedules.zero_bubble(p, m),
    "zb-h2": lambda p, m: schedules.zero_bubble_h2(p, m),
    "interleaved-zb-2": lambda p, m: schedules.interleaved_zero_bubble(p, m, 2),
    "interleaved-zb-3": lambda p, m: schedules.interleaved_zero_bubble(p, m - 1, 3),
    "zb-v": lambda p, m: schedules.zero_bubble_v(p, m, order="paper"),
    "zb-v-greedy": lambda p, m: schedules.zero_bubble_v(p, m, order="greedy"),
    "dualpipe-v": lambda p, m: schedules.dualpipe_v(p, m, order="paper"),
    "dualpipe-v-greedy": lambda p, m: schedules.dualpipe_v(p, m, order="greedy"),
}


@pytest.mark.parametrize("split", [True, False], ids=["split-backward", "whole-backward"])
@pytest.mark.parametrize("name", list(SCHEDULES))
def test_same_losses_and_gradients_as_unsplit(comm, xp, name, split):
    schedule = SCHEDULES[name](comm.size, 2 * comm.size)
    m = schedule.microbatches
    weights = init_weights([WIDTH] * (schedule.stages + 1), np.random.default_rng(0))
    xs, ts = data(m)
    want_losses, want_grads = reference(weights, xs, ts, scale=1 / m)
    layers, stages = build(schedule, comm.rank, weights, xp, split)
    first, last = comm.rank == 0, comm.rank == schedule.place(schedule.stages - 1)[0]
    for _step in range(2):  # the second step runs on cached layouts and reused buffers
        for layer in layers.values():
            layer.zero_grad()
        losses = pipeline.run(
            schedule,
            comm,
            stages,
            inputs=[xp.asarray(x) for x in xs] if first else None,
            targets=[xp.asarray(t) for t in ts] if last else None,
            loss_fn=lambda y, t: mse(y, t, scale=1 / m),
        )
        if last:
            np.testing.assert_allclose(losses, want_losses, rtol=1e-12)
        else:
            assert losses is None
        for s, layer in layers.items():
            np.testing.assert_allclose(
                _host(layer.grad_w), want_grads[s][0], rtol=1e-10, atol=1e-14
            )
            np.testing.assert_allclose(
                _host(layer.grad_b), want_grads[s][1], rtol=1e-10, atol=1e-14
            )


def test_interleaved_with_three_chunks_and_trace(comm, xp):
    p, m = comm.size, comm.size
    schedule = schedules.interleaved_1f1b(p, m, 3)
    weights = init_weights([WIDTH] * (schedule.stages + 1), np.random.default_rng(2))
    xs, ts = data(m, seed=3)
    _, want_grads = reference(weights, xs, ts, scale=1.0)
    layers, stages = build(schedule, comm.rank, weights, xp, split=False)
    inputs = [xp.asarray(x) for x in xs] if comm.rank == 0 else None
    targets = [xp.asarray(t) for t in ts] if comm.rank == p - 1 else None
    trace: list = []
    pipeline.run(schedule, comm, stages, inputs=inputs, targets=targets, loss_fn=mse, trace=trace)
    assert [str(a) for a, _, _ in trace] == [str(a) for a in schedule.actions[comm.rank]]
    assert all(end >= start for _, start, end in trace)
    for s, layer in layers.items():
        np.testing.assert_allclose(_host(layer.grad_w), want_grads[s][0], rtol=1e-10, atol=1e-14)


class TiedOut:
    """Output layer that reuses the input embedding: ``y = x @ E.T``."""

    def __init__(self, embedding):
        self.e, self.grad_e, self.saved = embedding, embedding * 0, {}

    def forward(self, x, mb):
        self.saved[mb] = x
        return x @ self.e.T

    def backward(self, dy, mb, split=False):
        self.grad_e += dy.T @ self.saved.pop(mb)
        return dy @ self.e

    def backward_weight(self, mb):
        pass


def test_pp_by_dp_with_tied_embedding(comm, xp):
    if comm.size != 4:
        pytest.skip("pp x dp is tested on 4 ranks (pp=2, dp=2)")
    mesh = col.DeviceMesh(comm, {"pp": 2, "dp": 2})
    pp, dp = mesh["pp"], mesh["dp"]
    stage_id, replica = mesh.coord["pp"], mesh.coord["dp"]
    rng = np.random.default_rng(4)
    d_in, hidden, m = 4, 6, 3
    e = rng.standard_normal((d_in, hidden)) / 2
    b0, w1, b1 = (
        rng.standard_normal(hidden),
        rng.standard_normal((hidden, hidden)) / 3,
        rng.standard_normal(hidden),
    )
    batches = [data_tied(rng, m, d_in) for _ in range(2)]  # one per dp replica
    want = tied_reference(e, b0, w1, b1, batches)

    schedule = schedules.one_f_one_b(2, m)
    if stage_id == 0:
        layer = Dense(xp.array(e), xp.array(b0))
        stage = Chain([layer]).stage(split=False)
        grads = {"e": layer.grad_w, "b0": layer.grad_b}
        tied = [layer.grad_w]
    else:
        hidden_layer, out = Dense(xp.array(w1), xp.array(b1)), TiedOut(xp.array(e))
        stage = Chain([hidden_layer, out]).stage(split=False)
        grads = {"w1": hidden_layer.grad_w, "b1": hidden_layer.grad_b, "e": out.grad_e}
        tied = [out.grad_e]
    xs, ts = ([xp.asarray(a) for a in arrays] for arrays in batches[replica])
    losses = pipeline.run(schedule, pp, [stage], inputs=xs if stage_id == 0 else None,
                          targets=ts if stage_id == 1 else None, loss_fn=lambda y, t: mse(y, t, 1 / m))  # fmt: skip
    group = pipeline.tied_group(pp)
    pipeline.reduce_tied(group, tied)
    for g in grads.values():
        dp.all_reduce(g, op="avg")
    for name, g in grads.items():
        np.testing.assert_allclose(_host(g), want[name], rtol=1e-10, atol=1e-14, err_msg=name)
    if stage_id == 1:
        np.testing.assert_allclose(losses, want["losses"][replica], rtol=1e-12)
    for c in (group, pp, dp):
        if c is not None:
            c.close()


def data_tied(rng, m, d_in):
    return (
        [rng.standard_normal((2, d_in)) for _ in range(m)],
        [rng.standard_normal((2, d_in)) for _ in range(m)],
    )


def tied_reference(e, b0, w1, b1, batches):
    """y = tanh(tanh(x E + b0) W1 + b1) E^T, gradients averaged over the replicas."""
    out = {k: 0.0 for k in ("e", "b0", "w1", "b1")}
    out["losses"] = []
    for xs, ts in batches:
        losses = []
        for x, t in zip(xs, ts):
            h0 = np.tanh(x @ e + b0)
            h1 = np.tanh(h0 @ w1 + b1)
            y = h1 @ e.T
            scale = 1 / len(xs)
            losses.append(scale * 0.5 * float(((y - t) ** 2).sum()) / len(x))
            dy = (y - t) * scale / len(x)
            de = dy.T @ h1
            dh1 = dy @ e
            dz1 = dh1 * (1 - h1**2)
            dh0 = dz1 @ w1.T
            dz0 = dh0 * (1 - h0**2)
            out["w1"] = out["w1"] + h0.T @ dz1
            out["b1"] = out["b1"] + dz1.sum(0)
            out["e"] = out["e"] + de + x.T @ dz0
            out["b0"] = out["b0"] + dz0.sum(0)
        out["losses"].append(losses)
    for k in ("e", "b0", "w1", "b1"):
        out[k] = out[k] / len(batches)
    return out


def test_bad_schedule_size_raises_on_every_rank(comm):
    schedule = schedules.one_f_one_b(comm.size + 1, 2)
    with pytest.raises(col.InvalidArgumentError, match="comm has size"):
        pipeline.run(schedule, comm, [pipeline.Stage(lambda x, m: x, lambda d, m: d)])


def _host(a):
    return a.get() if hasattr(a, "get") else a
