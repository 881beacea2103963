"""A timeout on every wait of the calls that make communicators: ``init``, ``split``,
``DeviceMesh`` and ``hierarchical`` end within their timeout, naming the ranks that never
called them, where without it they would wait forever. And bad ``split`` arguments raise
``InvalidArgumentError`` before anything is communicated.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col

WORLD_SIZES = (2,)
SPMD_TIMEOUT = 120
TIMEOUT = 1.0


def _rank() -> int:
    return MPI.COMM_WORLD.Get_rank()


def _raises_in_time(make, fragment: str) -> None:
    start = time.monotonic()
    with pytest.raises(col.CollectiveTimeoutError) as info:
        make()
    waited = time.monotonic() - start
    assert TIMEOUT <= waited < TIMEOUT + 10, waited
    message = str(info.value)
    assert f"not every rank called it within the timeout ({TIMEOUT:g} s)" in message, message
    assert fragment in message, message


def test_init_that_a_rank_never_calls_times_out_naming_it():
    if _rank() == 0:  # rank 1 never calls it
        _raises_in_time(lambda: col.init("mpi", timeout=TIMEOUT), "init: not every rank called it")
        _raises_in_time(lambda: col.init("mpi", timeout=TIMEOUT), "rank 1 never called it")
    MPI.COMM_WORLD.Barrier()
    with col.init("mpi", timeout=TIMEOUT) as comm:  # nothing left over: the next one works
        x = np.ones(2)
        comm.all_reduce(x)
        np.testing.assert_array_equal(x, 2.0)


@pytest.mark.parametrize("absent", [0, 1])
def test_split_that_a_rank_never_calls_times_out_naming_it(absent):
    comm = col.init("mpi", timeout=TIMEOUT)
    if comm.rank != absent:
        named = "rank 1 never called it" if absent == 1 else "rank 0 never said"
        _raises_in_time(lambda: comm.split(0), named)
        with pytest.raises(col.CommunicatorStateError, match="unusable after an earlier error"):
            comm.barrier()
    MPI.COMM_WORLD.Barrier()
    comm.close()


@pytest.mark.parametrize("what", ["DeviceMesh", "hierarchical"])
def test_device_mesh_and_hierarchical_that_a_rank_never_builds_time_out(what):
    comm = col.init("mpi", timeout=TIMEOUT)
    if comm.rank == 0:
        if what == "DeviceMesh":
            _raises_in_time(lambda: col.DeviceMesh(comm, {"dp": 2}), "rank 1 never called it")
        else:
            _raises_in_time(lambda: col.hierarchical(comm), "rank 1 never called it")
    MPI.COMM_WORLD.Barrier()
    comm.close()


@pytest.mark.parametrize(
    "args,expected",
    [
        ((0, "k"), "split: key must be an int in [-2**31, 2**31) or None, got 'k'"),
        ((0, 2**31), "split: key must be an int in [-2**31, 2**31) or None, got 2147483648"),
        ((2**31,), "split: color must be below 2**31, got 2147483648"),
        ((1.0,), "split: color must be a non-negative int or None, got 1.0"),
        ((True,), "split: color must be a non-negative int or None, got True"),
    ],
)
def test_bad_split_arguments_raise_before_communicating(comm, args, expected):
    with pytest.raises(col.InvalidArgumentError) as info:
        comm.split(*args)
    assert str(info.value) == expected
    sub = comm.split(0)  # every rank raised alike, so they are still in step
    assert sub is not None and sub.size == comm.size
    sub.close()
