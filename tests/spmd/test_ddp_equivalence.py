"""DDP gives, on every rank, the trajectory of the same model trained on the whole batch.

References are single-process NumPy float64 runs over the global batch. Bucket caps are tiny
so that the model spreads over many buckets. Parameters and gradients are arrays of the
backend under test (``xp``); the model's own arithmetic runs on the host.
"""

from __future__ import annotations

import numpy as np
import pytest

from ddp import DistributedDataParallel

SHARED_COMM = True  # COLLECTIVES_TEST_REUSE_COMM=1 may give every test one communicator

WORLD_SIZES = (1, 2, 3)
SPMD_TIMEOUT = 240

SIZES = [5, 7, 6, 3]  # in -> hidden -> hidden -> out
TINY = dict(bucket_cap_mb=200 / 2**20, first_bucket_cap_mb=64 / 2**20)


def init_params(seed, dtype=np.float64, xp=np):
    rng = np.random.default_rng(seed)
    params = {}
    for i, (a, b) in enumerate(zip(SIZES[:-1], SIZES[1:])):
        params[f"l{i}.w"] = xp.asarray((rng.standard_normal((a, b)) / np.sqrt(a)).astype(dtype))
        params[f"l{i}.b"] = xp.asarray((0.1 * rng.standard_normal(b)).astype(dtype))
    return params


def host(a) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy array."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


def on_host(arrays: dict) -> dict:
    return {k: host(v) for k, v in arrays.items()}


def data(n, seed=1):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, SIZES[0]))
    y = rng.integers(0, SIZES[-1], n)
    return x, y


def backward(params, x, y):
    """Mean cross-entropy over the rows of x; yields (name, grad) last layer first."""
    layers = len(SIZES) - 1
    acts = [x]
    for i in range(layers):
        z = acts[-1] @ params[f"l{i}.w"] + params[f"l{i}.b"]
        acts.append(np.tanh(z) if i < layers - 1 else z)
    logits = acts[-1]
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    dz = p
    dz[np.arange(len(y)), y] -= 1
    dz /= len(y)
    for i in reversed(range(layers)):
        yield f"l{i}.b", dz.sum(axis=0)
        yield f"l{i}.w", acts[i].T @ dz
        if i:
            dz = (dz @ params[f"l{i}.w"].T) * (1 - acts[i] ** 2)


def reference(params, x, y, steps, lr):
    params = {k: v.copy() for k, v in params.items()}
    trajectory = []
    for _ in range(steps):
        grads = dict(backward(params, x, y))
        for k in params:
            params[k] -= lr * grads[k]
        trajectory.append({k: v.copy() for k, v in params.items()})
    return trajectory


def shard(x, y, comm, uneven=False):
    if uneven:
        parts = np.array_split(np.arange(len(y)), comm.size)
        idx = parts[comm.rank]
    else:
        per = len(y) // comm.size
        idx = np.arange(comm.rank * per, (comm.rank + 1) * per)
    return x[idx], y[idx]


def assert_same(got, want, rtol=1e-12, atol=1e-14):
    assert got.keys() == want.keys()
    for k in want:
        np.testing.assert_allclose(host(got[k]), want[k], rtol=rtol, atol=atol, err_msg=k)


def test_trajectory_matches_whole_batch(comm, xp):
    x, y = data(12)  # 12 splits evenly over 1, 2, 3 ranks
    # rank-dependent initial values: DDP must broadcast rank 0's
    params = init_params(seed=10 + comm.rank, xp=xp)
    ddp = DistributedDataParallel(params, comm, **TINY)
    assert len(ddp.buckets) >= 4
    want = reference(init_params(seed=10), x, y, steps=5, lr=0.5)
    xs, ys = shard(x, y, comm)
    for step in range(5):
        ddp.zero_grad()
        for name, g in backward(on_host(params), xs, ys):
            ddp.grads[name][...] = xp.asarray(g)
            ddp.mark_ready(name)
        ddp.finish()
        ddp.finish()  # harmless
        for k, p in params.items():
            p -= 0.5 * ddp.grads[k]
        assert_same(params, want[step])


def test_weighted_uneven_shards(comm, xp):
    x, y = data(10)  # 10 over 3 ranks: 4, 3, 3
    params = init_params(seed=3, xp=xp)
    ddp = DistributedDataParallel(params, comm, **TINY)
    want = reference(on_host(params), x, y, steps=4, lr=0.3)
    xs, ys = shard(x, y, comm, uneven=True)
    ddp.weight = len(ys) / len(y)
    for step in range(4):
        ddp.zero_grad()
        for name, g in backward(on_host(params), xs, ys):
            ddp.grads[name][...] = xp.asarray(g)
            ddp.mark_ready(name)
        ddp.finish()
        for k, p in params.items():
            p -= 0.3 * ddp.grads[k]
        assert_same(params, want[step])


def test_sync_gradients_with_own_arrays(comm, xp):
    x, y = data(9)
    params = init_params(seed=4, xp=xp)
    ddp = DistributedDataParallel(params, comm, **TINY)
    want = reference(on_host(params), x, y, steps=3, lr=0.5)
    xs, ys = shard(x, y, comm, uneven=True)
    for step in range(3):
        grads = {k: xp.asarray(g) for k, g in backward(on_host(params), xs, ys)}
        ddp.sync_gradients(grads, weight=len(ys) / len(y))
        for k, p in params.items():
            p -= 0.5 * grads[k]
        assert_same(params, want[step])


def test_no_sync_accumulates(comm, xp):
    x, y = data(12, seed=5)
    params = init_params(seed=5, xp=xp)
    ddp = DistributedDataParallel(params, comm, **TINY)
    xs, ys = shard(x, y, comm)
    half = len(ys) // 2 if len(ys) > 1 else 1
    micro = [(xs[:half], ys[:half]), (xs[half:], ys[half:])]
    ddp.zero_grad()
    with ddp.no_sync():
        for name, g in backward(on_host(params), *micro[0]):
            ddp.grads[name] += xp.asarray(g)
            ddp.mark_ready(name)
        ddp.finish()  # records only
        assert ddp.stats.steps == 0
    for name, g in backward(on_host(params), *micro[1]):
        ddp.grads[name] += xp.asarray(g)
        ddp.mark_ready(name)
    ddp.finish()
    assert ddp.stats.steps == 1
    # reference: per rank sum of both micro-batch means, averaged over ranks
    want = {k: np.zeros_like(v) for k, v in on_host(params).items()}
    for r in range(comm.size):
        per = len(y) // comm.size
        xr, yr = x[r * per : (r + 1) * per], y[r * per : (r + 1) * per]
        for part in ((xr[:half], yr[:half]), (xr[half:], yr[half:])):
            for name, g in backward(on_host(params), *part):
                want[name] += g / comm.size
    assert_same(ddp.grads, want)


@pytest.mark.parametrize("order", ["forward", "random"])
def test_mixed_dtypes_and_any_marking_order(comm, order, xp):
    dtypes = [np.float64, np.float32, np.float16, np.complex128, np.float32, np.float64]
    shapes = [(3, 4), (5,), (2, 3), (4,), (7, 2), ()]
    params = {f"p{i}": xp.zeros(s, d) for i, (s, d) in enumerate(zip(shapes, dtypes))}
    ddp = DistributedDataParallel(
        params, comm, bucket_cap_mb=40 / 2**20, first_bucket_cap_mb=16 / 2**20
    )
    for b in ddp.buckets:
        assert all(params[n].dtype == b.dtype for n in b.names)

    def grad(name, rank):
        p = params[name]
        rng = np.random.default_rng([int(name[1:]), rank])
        g = rng.standard_normal(p.shape)
        if p.dtype.kind == "c":
            g = g + 1j * rng.standard_normal(p.shape)
        return g.astype(p.dtype)

    names = list(params)
    if order == "random":  # the same permutation everywhere is not required: use the rank
        names = list(np.random.default_rng(comm.rank).permutation(names))
    for _step in range(2):
        ddp.zero_grad()
        for name in names:
            ddp.grads[name][...] = xp.asarray(grad(name, comm.rank))
            ddp.mark_ready(name)
        ddp.finish()
        for name, p in params.items():
            exact = sum(grad(name, r).astype(np.complex128) for r in range(comm.size)) / comm.size
            tol = {np.float16: 2e-3, np.float32: 1e-6}.get(p.dtype.type, 1e-13)
            got = host(ddp.grads[name])
            np.testing.assert_allclose(got, exact, rtol=tol, atol=tol, err_msg=name)


def test_unused_parameters_are_reduced_as_they_are(comm, xp):
    params = init_params(seed=6, xp=xp)
    ddp = DistributedDataParallel(params, comm, **TINY)
    ddp.zero_grad()
    ddp.grads["l1.w"][...] = comm.rank + 1.0  # written but never marked
    ddp.mark_ready("l2.b")
    ddp.finish()
    np.testing.assert_allclose(host(ddp.grads["l1.w"]), (comm.size + 1) / 2)
    assert not ddp.grads["l0.w"].any()
    assert [b.index for b in ddp.buckets] == list(range(len(ddp.buckets)))


def test_stats_and_broadcast_buffers(comm, xp):
    params = init_params(seed=7, xp=xp)
    ddp = DistributedDataParallel(params, comm, **TINY)
    ddp.zero_grad()
    ddp.finish()
    stats = ddp.stats
    assert [s.nbytes for s in stats.buckets] == [b.nbytes for b in ddp.buckets]
    assert sum(s.nbytes for s in stats.buckets) == sum(p.nbytes for p in params.values())
    assert all(0 <= s.start_s <= s.end_s for s in stats.buckets)
    assert stats.steps == 1 and stats.total_wait_s >= stats.wait_s >= 0

    running = {"mean": xp.full(3, float(comm.rank)), "count": xp.array([comm.rank], np.int64)}
    ddp.broadcast_buffers(running, root=comm.size - 1)
    np.testing.assert_array_equal(host(running["mean"]), np.full(3, comm.size - 1.0))
    assert int(running["count"][0]) == comm.size - 1
