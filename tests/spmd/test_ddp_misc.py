"""Error cases of DistributedDataParallel, and clip_grad_norm / LocalSGD / LoadBalancer
over a communicator, on arrays of the backend under test (``xp``)."""

from __future__ import annotations

import numpy as np
import pytest

from collectives import CollectiveMismatchError, InvalidArgumentError
from ddp import DistributedDataParallel, LoadBalancer, LocalSGD, clip_grad_norm

SHARED_COMM = True  # COLLECTIVES_TEST_REUSE_COMM=1 may give every test one communicator

WORLD_SIZES = (1, 2, 3)
SPMD_TIMEOUT = 240


def params(xp=np):
    return {"a.w": xp.zeros((3, 2)), "a.b": xp.zeros(2), "b.w": xp.zeros((2, 2))}


def host(a) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy array."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


def test_mismatch_names_first_differing_parameter_on_every_rank(comm, xp):
    if comm.size == 1:
        pytest.skip("needs two ranks to differ")
    p = params(xp)
    if comm.rank == 1:
        p["a.b"] = xp.zeros(3)
    with pytest.raises(CollectiveMismatchError) as info:
        DistributedDataParallel(p, comm)
    message = str(info.value)
    assert "parameter 1" in message
    assert "rank 1: 'a.b' shape (3,) dtype float64" in message
    assert "'a.b' shape (2,) dtype float64" in message


def test_mismatch_in_count_and_dtype(comm, xp):
    if comm.size == 1:
        pytest.skip("needs two ranks to differ")
    p = params(xp)
    if comm.rank == comm.size - 1:
        p["extra"] = xp.zeros(1, np.float32)
    with pytest.raises(CollectiveMismatchError, match=r"at parameter 3: .*no parameter.*'extra'"):
        DistributedDataParallel(p, comm)


def test_argument_errors(comm, xp):
    with pytest.raises(InvalidArgumentError, match="DistributedDataParallel: params is empty"):
        DistributedDataParallel({}, comm)
    with pytest.raises(
        InvalidArgumentError, match=r"params\['i'\] has dtype int64, expected a floating"
    ):
        DistributedDataParallel({"i": xp.zeros(2, np.int64)}, comm)
    with pytest.raises(
        InvalidArgumentError, match=f"broadcast_from must be None or in \\[0, {comm.size}\\), got 9"
    ):
        DistributedDataParallel(params(xp), comm, broadcast_from=9)
    with pytest.raises(InvalidArgumentError, match="params must be a mapping"):
        DistributedDataParallel([xp.zeros(2)], comm)
    with pytest.raises(InvalidArgumentError, match="bucket_cap_mb must be > 0"):
        DistributedDataParallel(params(xp), comm, bucket_cap_mb=0)


def test_numpy_params_are_refused_where_the_communicator_takes_device_arrays(comm):
    # asked of comm.xp, not of the backend's name: NCCL's calls take device arrays only
    if comm.xp is np:
        pytest.skip("this communicator takes NumPy arrays")
    with pytest.raises(
        InvalidArgumentError,
        match=f"params are NumPy arrays, expected {comm.xp.__name__} arrays \\(comm.xp\\)",
    ):
        DistributedDataParallel(params(), comm)


def test_step_errors(comm, xp):
    ddp = DistributedDataParallel(params(xp), comm)
    with pytest.raises(InvalidArgumentError, match="mark_ready: name 'nope' is not one of the 3"):
        ddp.mark_ready("nope")
    ddp.mark_ready("a.b")
    with pytest.raises(InvalidArgumentError, match="mark_ready: gradient 'a.b' was already marked"):
        ddp.mark_ready("a.b")
    with pytest.raises(
        InvalidArgumentError, match="sync_gradients: a mark_ready step is in progress"
    ):
        ddp.sync_gradients({k: xp.zeros_like(v) for k, v in params(xp).items()})
    ddp.mark_ready("b.w")
    ddp.mark_ready("a.w")  # all marked: the bucket started
    with pytest.raises(
        InvalidArgumentError, match="no_sync: reductions of this step already started"
    ):
        with ddp.no_sync():
            pass
    ddp.finish()
    with pytest.raises(InvalidArgumentError, match="weight must be None or a finite number >= 0"):
        ddp.weight = -1.0
    with pytest.raises(
        InvalidArgumentError, match=r"sync_gradients: grads\['a.b'\] has shape \(3,\)"
    ):
        ddp.sync_gradients({**params(xp), "a.b": xp.zeros(3)})
    with pytest.raises(InvalidArgumentError, match=r"missing \['b.w'\], unknown \['x'\]"):
        ddp.sync_gradients({"a.w": xp.zeros((3, 2)), "a.b": xp.zeros(2), "x": xp.zeros(1)})
    with pytest.raises(InvalidArgumentError, match="broadcast_buffers: root must be in"):
        ddp.broadcast_buffers([xp.zeros(2)], root=comm.size)


def test_clip_grad_norm_sharded_and_replicated(comm, xp):
    full = np.arange(1.0, 13.0)  # the whole model's gradient, sharded over ranks
    shard = xp.array(np.array_split(full, comm.size)[comm.rank])
    bias = xp.array([2.0, -1.0])  # replicated on every rank: counts once
    want = np.sqrt((full**2).sum() + 5.0)
    norm = clip_grad_norm([shard], 1.0, comm, replicated=[bias])
    assert norm == pytest.approx(want)
    scale = 1.0 / (want + 1e-6)
    np.testing.assert_allclose(host(shard), np.array_split(full, comm.size)[comm.rank] * scale)
    np.testing.assert_allclose(host(bias), [2.0 * scale, -scale])
    inf = clip_grad_norm(
        {"s": xp.array(np.array_split(-full, comm.size)[comm.rank])},
        100.0,
        comm,
        norm_type=float("inf"),
    )
    assert inf == 12.0


def test_local_sgd_averages_every_period(comm, xp):
    p = {"w": xp.full((2, 3), float(comm.rank)), "b": xp.full(3, 2.0 * comm.rank, np.float32)}
    local = LocalSGD(p, comm, period=3, broadcast_from=None)
    mean = (comm.size - 1) / 2
    done = []
    for step in range(6):
        p["w"] += comm.rank  # rank-dependent local progress
        done.append(local.step())
        if step == 2:
            # after 3 local steps of +rank: rank + 3 rank = 4 rank, averaged
            np.testing.assert_allclose(host(p["w"]), 4 * mean)
            np.testing.assert_allclose(host(p["b"]), 2 * mean)
    assert done == [False, False, True, False, False, True]
    assert local.averages == 2
    with pytest.raises(InvalidArgumentError, match="LocalSGD: period must be an integer >= 1"):
        LocalSGD(p, comm, period=0)


def test_local_sgd_starts_from_root(comm, xp):
    p = [xp.full(4, float(comm.rank + 1))]
    LocalSGD(p, comm, period=2, broadcast_from=0)
    np.testing.assert_array_equal(host(p[0]), np.ones(4))


def test_load_balancer_record(comm):
    lb = LoadBalancer(comm, 12 * comm.size, smoothing=1.0)
    assert sum(lb.shares) == 12 * comm.size and lb.local_batch == 12
    # rank r processes its 12 samples in (r + 1) seconds: throughput 12 / (r + 1)
    shares = lb.record(float(comm.rank + 1), lb.local_batch)
    thr = [12 / (r + 1) for r in range(comm.size)]
    want = [t / sum(thr) * 12 * comm.size for t in thr]
    assert sum(shares) == 12 * comm.size
    assert all(abs(s - w) < 1 for s, w in zip(shares, want))
    assert lb.weight == shares[comm.rank] / (12 * comm.size)
