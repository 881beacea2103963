"""Column- and row-parallel linear layers against the unsharded MLP, in float64."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import InvalidArgumentError
from ddp.tensor_parallel import ColumnParallelLinear, RowParallelLinear

SHARED_COMM = True  # COLLECTIVES_TEST_REUSE_COMM=1 may give every test one communicator

WORLD_SIZES = (1, 2, 4)
IN, OUT = 5, 3


def host(a):
    return a.get() if hasattr(a, "get") else a


def mlp_reference(x, w1, b1, w2, b2, dy):
    """Forward and backward of relu(x @ w1 + b1) @ w2 + b2, unsharded."""
    h = x @ w1 + (0 if b1 is None else b1)
    a = np.maximum(h, 0)
    y = a @ w2 + (0 if b2 is None else b2)
    da = dy @ w2.T
    dh = da * (h > 0)
    flat = lambda t: t.reshape(-1, t.shape[-1])  # noqa: E731
    grads = {
        "w1": flat(x).T @ flat(dh),
        "b1": flat(dh).sum(0),
        "w2": flat(a).T @ flat(dy),
        "b2": flat(dy).sum(0),
    }
    return y, dh @ w1.T, grads


def weights(size, bias):
    rng = np.random.default_rng(0)
    hidden = 2 * size
    w1, w2 = rng.standard_normal((IN, hidden)), rng.standard_normal((hidden, OUT))
    b1 = rng.standard_normal(hidden) if bias else None
    b2 = rng.standard_normal(OUT) if bias else None
    return w1, b1, w2, b2


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("sequence_parallel", [False, True])
def test_column_then_row_equals_unsharded_mlp(comm, xp, bias, sequence_parallel):
    size, rank = comm.size, comm.rank
    w1, b1, w2, b2 = weights(size, bias)
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((2 * size, 3, IN)), rng.standard_normal((2 * size, 3, OUT))
    y_ref, dx_ref, g = mlp_reference(x, w1, b1, w2, b2, dy)

    as_xp = lambda a: None if a is None else xp.asarray(a)  # noqa: E731
    fc1 = ColumnParallelLinear(as_xp(w1), as_xp(b1), comm, sequence_parallel=sequence_parallel)
    fc2 = RowParallelLinear(as_xp(w2), as_xp(b2), comm, sequence_parallel=sequence_parallel)
    rows = slice(2 * rank, 2 * rank + 2)  # this rank's block of the first axis (seq parallel)
    x_in, dy_in = (x[rows], dy[rows]) if sequence_parallel else (x, dy)
    h = fc1.forward(xp.asarray(x_in))
    y = fc2.forward(xp.maximum(h, 0))
    dx = fc1.backward(fc2.backward(xp.asarray(dy_in)) * (h > 0))

    k = w1.shape[1] // size
    cols = slice(rank * k, (rank + 1) * k)
    np.testing.assert_allclose(host(y), y_ref[rows] if sequence_parallel else y_ref, rtol=1e-12)
    np.testing.assert_allclose(host(dx), dx_ref[rows] if sequence_parallel else dx_ref, rtol=1e-12)
    np.testing.assert_allclose(host(fc1.grad_weight), g["w1"][:, cols], rtol=1e-12)
    np.testing.assert_allclose(host(fc2.grad_weight), g["w2"][cols], rtol=1e-12)
    if bias:
        np.testing.assert_allclose(host(fc1.grad_bias), g["b1"][cols], rtol=1e-12)
        np.testing.assert_allclose(host(fc2.grad_bias), g["b2"], rtol=1e-12)
    else:
        assert fc1.grad_bias is None and fc2.grad_bias is None
    assert fc1.weight.shape == (IN, k) and fc2.weight.shape == (k, OUT)


def test_column_gather_output_and_row_full_input(comm, xp):
    """Each layer alone, with replicated input and output, equals the unsharded linear map."""
    size, rank = comm.size, comm.rank
    rng = np.random.default_rng(2)
    w, b = rng.standard_normal((IN, 2 * size)), rng.standard_normal(2 * size)
    x, dy = rng.standard_normal((4, IN)), rng.standard_normal((4, 2 * size))
    col = ColumnParallelLinear(xp.asarray(w), xp.asarray(b), comm, gather_output=True)
    np.testing.assert_allclose(host(col.forward(xp.asarray(x))), x @ w + b, rtol=1e-12)
    np.testing.assert_allclose(host(col.backward(xp.asarray(dy))), dy @ w.T, rtol=1e-12)
    np.testing.assert_allclose(host(col.grad_weight), (x.T @ dy)[:, 2 * rank : 2 * rank + 2])

    w2, b2 = w.T.copy(), rng.standard_normal(IN)  # (2 * size, IN)
    x2, dy2 = rng.standard_normal((4, 2 * size)), rng.standard_normal((4, IN))
    row = RowParallelLinear(xp.asarray(w2), xp.asarray(b2), comm, input_is_parallel=False)
    np.testing.assert_allclose(host(row.forward(xp.asarray(x2))), x2 @ w2 + b2, rtol=1e-12)
    np.testing.assert_allclose(host(row.backward(xp.asarray(dy2))), dy2 @ w2.T, rtol=1e-12)
    np.testing.assert_allclose(host(row.grad_weight), (x2.T @ dy2)[2 * rank : 2 * rank + 2])
    np.testing.assert_allclose(host(row.grad_bias), dy2.sum(0))


def test_layer_errors(comm, xp):
    size = comm.size
    w = xp.ones((4, 2 * size))
    with pytest.raises(InvalidArgumentError, match=r"bias has shape \(3,\), expected"):
        ColumnParallelLinear(w, xp.ones(3), comm)
    with pytest.raises(InvalidArgumentError, match="weight has shape"):
        RowParallelLinear(xp.ones(4), None, comm)
    with pytest.raises(InvalidArgumentError, match="at most one"):
        ColumnParallelLinear(w, None, comm, gather_output=True, sequence_parallel=True)
    with pytest.raises(InvalidArgumentError, match="input_is_parallel=True"):
        RowParallelLinear(w.T, None, comm, input_is_parallel=False, sequence_parallel=True)
    fc = ColumnParallelLinear(w, None, comm)
    with pytest.raises(InvalidArgumentError, match=r"x has shape \(2, 3\), expected \(\.\.\., 4\)"):
        fc.forward(xp.ones((2, 3)))
    with pytest.raises(InvalidArgumentError, match="expected forward"):
        fc.backward(xp.ones((2, 2)))
    if size > 1:
        with pytest.raises(InvalidArgumentError, match="out_features .* multiple of the group"):
            ColumnParallelLinear(xp.ones((4, 2 * size + 1)), None, comm)
        with pytest.raises(InvalidArgumentError, match="in_features .* multiple of the group"):
            RowParallelLinear(xp.ones((2 * size + 1, 4)), None, comm)
