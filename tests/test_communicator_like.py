"""``CommunicatorLike``, what ddp and pipeline need from a communicator, at run time (in-process).

mypy checks the members' types (``collectives/_communicator_like.py``); Python's runtime
check of a Protocol sees only that they are there, which is what is tested here.
"""

from __future__ import annotations

import numpy as np

import collectives as col
from collectives import CommunicatorLike
from ddp import DistributedDataParallel
from ddp.hooks import fp16_compress_wrapper

MEMBERS = (
    "rank",
    "size",
    "backend",
    "device",
    "stream",
    "mpi_comm",
    "xp",
    "all_reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "send",
    "recv",
    "barrier",
    "group",
    "split",
)


def test_a_communicator_its_split_and_its_hierarchical_view_are_communicator_like():
    with col.init(backend="mpi", timeout=30) as comm:
        assert isinstance(comm, CommunicatorLike)
        child = comm.split(0)
        assert child is not None
        try:
            assert isinstance(child, CommunicatorLike)
        finally:
            child.close()
        view = col.hierarchical(comm)
        try:
            assert isinstance(view, CommunicatorLike)
        finally:
            view.close()


def _stand_in(without: str | None = None) -> object:
    """An object with every member but ``without``, each a placeholder (not None: a member
    set to None counts as missing)."""
    return type("StandIn", (), {name: print for name in MEMBERS if name != without})()


def test_the_protocol_lists_the_members_and_an_object_missing_one_is_not_like():
    assert set(MEMBERS) == {name for name in vars(CommunicatorLike) if not name.startswith("_")}
    assert isinstance(_stand_in(), CommunicatorLike)
    for name in MEMBERS:
        assert not isinstance(_stand_in(without=name), CommunicatorLike), name
    assert not isinstance(np.zeros(1), CommunicatorLike)


def test_what_a_compression_hook_hands_the_wrapped_hook_is_communicator_like():
    seen = []

    def hook(comm, bucket):
        seen.append(isinstance(comm, CommunicatorLike))
        return comm.all_reduce(bucket.buffer, op="avg", async_op=True)

    with col.init(backend="mpi", timeout=30) as comm:
        ddp = DistributedDataParallel(
            {"w": np.ones(4, np.float32)}, comm, hook=fp16_compress_wrapper(hook)
        )
        grads = {"w": np.full(4, 2.0, np.float32)}
        ddp.sync_gradients(grads)
    assert seen == [True]
    np.testing.assert_array_equal(grads["w"], np.full(4, 2.0, np.float32))
