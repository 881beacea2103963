"""``ddp.tune_bucket_cap`` and ``bucket_cap_mb="auto"``: every rank takes the same cap, one
of the candidates, and reports what it measured."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

from collectives import CollectiveMismatchError, InvalidArgumentError
from ddp import DistributedDataParallel, tune_bucket_cap

WORLD_SIZES = (2,)
SPMD_TIMEOUT = 120

SHAPES = {f"layer{i}.w": (64, 64) for i in range(6)}  # 16 KiB each


def params(xp):
    return {k: xp.zeros(s, np.float32) for k, s in SHAPES.items()}


def test_every_rank_takes_rank_0s_choice_among_the_candidates(comm, xp):
    caps = (0.015, 0.04, 0.1, 1)
    tuning = tune_bucket_cap(comm, params(xp), caps, first_bucket_cap_mb=0.015, rounds=2)
    assert tuning.cap_mb in caps and tuning.caps_mb == caps
    assert tuning.buckets == (6, 4, 2, 2)  # the first bucket holds one layer (cap 0.015)
    assert tuning.nbytes == 6 * 64 * 64 * 4 and tuning.rounds == 2 and tuning.size == comm.size
    assert len(tuning.seconds) == len(tuning.local_seconds) == len(caps)
    assert all(s > 0 for s in tuning.seconds + tuning.local_seconds)
    assert tuning.seconds[caps.index(tuning.cap_mb)] == min(tuning.seconds)
    every = MPI.COMM_WORLD.allgather((tuning.cap_mb, tuning.seconds))
    assert all(e == every[0] for e in every)
    if comm.rank == 0:
        assert tuning.seconds == tuning.local_seconds
    text = str(tuning)
    assert "<- chosen" in text and all(f"{c:8g}" in text for c in caps)


def test_shape_dtype_pairs_are_enough(comm):
    pairs = {"a": ((1000,), "float64"), "b": ((10,), "float32")}
    tuning = tune_bucket_cap(comm, pairs, (0.001, 1), rounds=1)
    assert tuning.cap_mb in (0.001, 1.0) and tuning.nbytes == 8040


def test_auto_cap(comm, xp):
    model = DistributedDataParallel(params(xp), comm, bucket_cap_mb="auto")
    assert model.tuning is not None and model.bucket_cap_mb == model.tuning.cap_mb
    assert model.bucket_cap_mb in (1, 5, 10, 25, 50, 100)
    assert MPI.COMM_WORLD.allgather(model.bucket_cap_mb) == [model.bucket_cap_mb] * comm.size
    for g in model.grads.values():
        g[...] = comm.rank
    model.finish()
    assert all(
        float(g.max()) == float(g.min()) == (comm.size - 1) / 2 for g in model.grads.values()
    )
    assert DistributedDataParallel(params(xp), comm).tuning is None


def test_bad_arguments_are_refused_before_communicating(comm, xp):
    with pytest.raises(InvalidArgumentError, match="caps_mb must be a non-empty sequence"):
        tune_bucket_cap(comm, params(xp), ())
    with pytest.raises(InvalidArgumentError, match="caps_mb must be"):
        tune_bucket_cap(comm, params(xp), (1, -5))
    with pytest.raises(InvalidArgumentError, match="rounds must be a positive int"):
        tune_bucket_cap(comm, params(xp), rounds=0)
    with pytest.raises(InvalidArgumentError, match="params must be a non-empty mapping"):
        tune_bucket_cap(comm, {})
    with pytest.raises(
        InvalidArgumentError, match="bucket_cap_mb must be a number of MiB or 'auto'"
    ):
        DistributedDataParallel(params(xp), comm, bucket_cap_mb="fast")
    comm.barrier()


def test_layouts_that_differ_across_ranks_are_named(comm, xp):
    p = params(xp)
    if comm.rank == 1:
        p["extra"] = xp.zeros(3, np.float32)
    with pytest.raises(
        CollectiveMismatchError, match="tune_bucket_cap: params differ across ranks"
    ):
        tune_bucket_cap(comm, p, (1,))
