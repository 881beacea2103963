"""pipeline.run without other ranks: one rank holding every chunk, and argument errors."""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import numpy as np
import pytest

import collectives as col
import pipeline
from pipeline.mlp import Chain, Dense, init_weights, mse
from pipeline.schedules import (
    dualpipe_v,
    gpipe,
    interleaved_1f1b,
    one_f_one_b,
    zero_bubble,
    zero_bubble_v,
)


class FakeComm:
    """Records sends; enough for checks that fire before anything is received."""

    backend = "mpi"
    xp = np

    def __init__(self, rank, size):
        self.rank, self.size, self.sent = rank, size, []

    @contextmanager
    def group(self):
        yield self

    def send(self, x, peer):
        self.sent.append((x.copy(), peer))

    def recv(self, x, peer):
        raise AssertionError("not expected to receive")


def unsplit(weights, xs, ts):
    layers = [
        Dense(w.copy(), b.copy(), None if i == len(weights) - 1 else "tanh")
        for i, (w, b) in enumerate(weights)
    ]
    chain = Chain(layers)
    losses = []
    for m, (x, t) in enumerate(zip(xs, ts)):
        loss, dy = mse(chain.forward(x, m), t)
        chain.backward(dy, m)
        losses.append(loss)
    return losses, layers


@pytest.mark.parametrize(
    "make,split",
    [
        (lambda m: interleaved_1f1b(1, m, 3), False),
        (lambda m: interleaved_1f1b(1, m, 3), True),
        (lambda m: zero_bubble(1, m), True),
        (lambda m: zero_bubble_v(1, m), True),
        (lambda m: dualpipe_v(1, m), False),
    ],
)
def test_one_rank_with_chunks_matches_unsplit(make, split):
    m = 4
    schedule = make(m)
    chunks = schedule.chunks
    rng = np.random.default_rng(0)
    weights = init_weights([3] * (chunks + 1), rng)
    xs = [rng.standard_normal((2, 3)) for _ in range(m)]
    ts = [rng.standard_normal((2, 3)) for _ in range(m)]
    want_losses, want_layers = unsplit(weights, xs, ts)
    layers = [
        Dense(w.copy(), b.copy(), None if i == chunks - 1 else "tanh")
        for i, (w, b) in enumerate(weights)
    ]
    stages = [Chain([layer]).stage(split=split) for layer in layers]
    losses = pipeline.run(schedule, FakeComm(0, 1), stages, inputs=xs, targets=ts, loss_fn=mse)
    np.testing.assert_allclose(losses, want_losses, rtol=1e-13)
    for got, want in zip(layers, want_layers):
        np.testing.assert_allclose(got.grad_w, want.grad_w, rtol=1e-12)
        np.testing.assert_allclose(got.grad_b, want.grad_b, rtol=1e-12)


STAGE = pipeline.Stage(lambda x, m: x, lambda dy, m: dy)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(comm=FakeComm(0, 3)), r"pipeline.run: comm has size 3, expected schedule.ranks=2"),
        (
            dict(stages=[STAGE, STAGE]),
            r"stages has 2 entries, expected one Stage per chunk \(schedule.chunks=1\)",
        ),
        (dict(inputs=None), r"inputs is None on rank 0 \(first stage\), expected 4"),
        (dict(inputs=[np.zeros(2)]), r"inputs is 1 arrays on rank 0 \(first stage\), expected 4"),
        (
            dict(comm=FakeComm(1, 2), targets=None),
            r"targets is None on rank 1 \(last stage\), expected 4",
        ),
        (dict(comm=FakeComm(1, 2), loss_fn=None), r"loss_fn is None on rank 1 \(last stage\)"),
        (dict(schedule="1f1b"), r"schedule is a str, expected a Schedule"),
    ],
)
def test_bad_arguments(kwargs, match):
    args = dict(schedule=one_f_one_b(2, 4), comm=FakeComm(0, 2), stages=[STAGE],
                inputs=[np.zeros(2)] * 4, targets=[np.zeros(2)] * 4, loss_fn=mse)  # fmt: skip
    args.update(kwargs)
    with pytest.raises(col.InvalidArgumentError, match=match):
        pipeline.run(args.pop("schedule"), args.pop("comm"), args.pop("stages"), **args)


def test_microbatches_of_different_shapes_are_refused_before_sending():
    comm = FakeComm(0, 2)
    xs = [np.zeros((2, 3)), np.zeros((5, 3))]
    with pytest.raises(
        col.InvalidArgumentError,
        match=r"stage 0 output for microbatch 1 has .*\(5, 3\).*expected.*\(2, 3\)",
    ):
        pipeline.run(gpipe(2, 2), comm, [STAGE], inputs=xs)
    header, payload = comm.sent[0][0], comm.sent[1][0]
    float64 = col.DTYPES.index("float64")
    assert list(header[:5]) == [float64, 0, 2, 2, 3]  # float64, NumPy, 2 dims: (2, 3)
    assert payload.shape == (2, 3)


def test_bfloat16_activations_travel_with_their_dtype_in_the_header():
    """The header's dtype codes are collectives' table, bfloat16 (ml_dtypes') included."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    comm = FakeComm(0, 2)
    xs = [np.ones((2, 3), ml_dtypes.bfloat16), np.ones((5, 3), ml_dtypes.bfloat16)]
    with pytest.raises(col.InvalidArgumentError, match="microbatches must match"):
        pipeline.run(gpipe(2, 2), comm, [STAGE], inputs=xs)
    header, payload = comm.sent[0][0], comm.sent[1][0]
    assert list(header[:3]) == [col.DTYPES.index("bfloat16"), 0, 2]
    assert payload.dtype == ml_dtypes.bfloat16


def test_unsupported_dtype_is_refused():
    xs = [np.zeros((2, 3), dtype=bool)]
    with pytest.raises(
        col.InvalidArgumentError,
        match="has dtype bool and 2 dims, expected one of int8, .*bfloat16",
    ):
        pipeline.run(gpipe(2, 1), FakeComm(0, 2), [STAGE], inputs=xs)


def test_a_stage_that_raises_shows_the_action_list_with_the_failing_action_marked():
    def forward(x, mb):
        if mb == 1:
            raise ValueError("bad microbatch")
        return x

    schedule = zero_bubble_v(1, 2)  # rank 0 holds stage 0 (chunk 0) and stage 1 (chunk 1)
    stages = [STAGE, pipeline.Stage(forward, lambda dy, mb: dy)]
    xs = [np.zeros(2)] * 2
    with pytest.raises(pipeline.StageError) as info:
        pipeline.run(schedule, FakeComm(0, 1), stages, inputs=xs, targets=xs, loss_fn=mse)
    at = [str(a) for a in schedule.actions[0]].index("1F1")
    assert info.value.rank == 0 and info.value.index == at and str(info.value.action) == "1F1"
    assert isinstance(info.value.__cause__, ValueError)
    message = str(info.value)
    assert "rank 0 failed at action" in message and "(1F1, model stage 1)" in message
    assert "ValueError: bad microbatch" in message
    assert message.splitlines()[-1].split()[at + 3] == ">1F1"  # "rank 0 |" then the actions


def test_tied_group_bad_ranks():
    with pytest.raises(
        col.InvalidArgumentError, match=r"tied_group: ranks is \[0, 5\], expected ranks in \[0, 2\)"
    ):
        pipeline.tied_group(SimpleNamespace(size=2, rank=0), ranks=[0, 5])
    pipeline.reduce_tied(None, [np.zeros(2)])  # not a holder: nothing to do
