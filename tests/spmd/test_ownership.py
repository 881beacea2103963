"""One owner thread per communicator: a call from another thread is refused on every rank.

A refusal decided by which thread got there first would differ between ranks and match one
thread's call with another's (silently wrong sums). The owner is the thread that made the
communicator, or the one ``comm.hand_over`` gave it to: every rank decides the same way.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import collectives as col

WORLD_SIZES = (1, 2)
SPMD_TIMEOUT = 120


def _in_thread(target) -> BaseException | None:
    """Run ``target`` in a new thread; the exception it raised, or None."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as e:  # noqa: BLE001 - handed to the calling thread
            errors.append(e)

    thread = threading.Thread(target=run, name="worker")
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the thread's call never returned"
    return errors[0] if errors else None


def _all_reduce_is_right(comm, xp) -> None:
    x = xp.full(3, comm.rank + 1.0)
    comm.all_reduce(x)
    np.testing.assert_array_equal(np.asarray(x.get() if hasattr(x, "get") else x),
                                  comm.size * (comm.size + 1) / 2)  # fmt: skip


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("call", ["all_reduce", "broadcast", "barrier", "split", "group"])
def test_a_call_from_another_thread_is_refused_on_every_rank(comm, xp, call, async_op):
    def other() -> None:
        if call == "all_reduce":
            comm.all_reduce(xp.ones(2), async_op=async_op)
        elif call == "broadcast":
            comm.broadcast(xp.ones(2), async_op=async_op)
        elif call == "barrier":
            comm.barrier(async_op=async_op)
        elif call == "split":
            comm.split(0)
        else:
            with comm.group():
                pass

    error = _in_thread(other)
    assert isinstance(error, col.CommunicatorStateError), error
    message = str(error)
    assert message.startswith(f"{call}: called from thread 'worker'"), message
    assert f"belongs to thread {threading.current_thread().name!r}" in message
    assert comm.flight_record() == []  # refused before anything was issued
    _all_reduce_is_right(comm, xp)  # and the owner's calls go on, in step


def test_hand_over_gives_the_communicator_to_another_thread_and_back(comm, xp):
    main = threading.current_thread()
    worker_results: list = []

    def worker_body() -> None:
        with comm.device_scope():  # the documented first step of a thread given a communicator
            x = xp.full(2, comm.rank + 1.0)
            worker_results.append(comm.all_reduce(x, async_op=True).wait())
        comm.hand_over(main)

    worker = threading.Thread(target=worker_body, name="worker")
    comm.hand_over(worker)  # before it starts: its ident is learned on its first call
    assert comm.owner is worker
    with pytest.raises(col.CommunicatorStateError, match="belongs to thread 'worker'"):
        comm.all_reduce(xp.ones(2))  # the main thread no longer owns it
    worker.start()
    worker.join(60)
    assert not worker.is_alive()
    assert len(worker_results) == 1
    got = worker_results[0]
    np.testing.assert_array_equal(got.get() if hasattr(got, "get") else got,
                                  comm.size * (comm.size + 1) / 2)  # fmt: skip
    assert comm.owner is main
    _all_reduce_is_right(comm, xp)


def test_a_thread_works_on_the_communicators_device_inside_device_scope(comm, xp):
    """CUDA's current device is per thread and starts at 0: a thread given a communicator on
    another device makes arrays there only inside ``comm.device_scope()``; outside it, the
    refusal says what to do. Every rank makes the same calls, refused or not."""
    if comm.device is None:
        with comm.device_scope():  # nothing to make current on MPI
            _all_reduce_is_right(comm, xp)
        return
    outcome: list = []

    def worker_body() -> None:
        if comm.device != 0:  # refused before communicating: the ranks stay in step
            x = xp.ones(2)  # made on this thread's current device: 0
            try:
                comm.all_reduce(x)
            except col.InvalidArgumentError as e:
                outcome.append(("refused", str(e)))
        with comm.device_scope():
            y = xp.full(2, comm.rank + 1.0)
            outcome.append(("device", y.device.id))
            comm.all_reduce(y)
            outcome.append(("sum", y.get().tolist()))
        comm.hand_over(main)

    main = threading.current_thread()
    worker = threading.Thread(target=worker_body, name="worker")
    comm.hand_over(worker)
    worker.start()
    worker.join(60)
    assert not worker.is_alive()
    sums = [v for k, v in outcome if k == "sum"]
    assert [v for k, v in outcome if k == "device"] == [comm.device]
    assert sums == [[comm.size * (comm.size + 1) / 2] * 2]
    if comm.device != 0:
        refusal = next(v for k, v in outcome if k == "refused")
        assert f"x is on device 0, expected device {comm.device}" in refusal, refusal
        assert "comm.device_scope()" in refusal, refusal
    _all_reduce_is_right(comm, xp)


def test_only_the_owner_hands_over(comm):
    error = _in_thread(lambda: comm.hand_over(threading.current_thread()))
    assert isinstance(error, col.CommunicatorStateError), error
    assert str(error).startswith("hand_over: called from thread 'worker'")
    with pytest.raises(col.InvalidArgumentError, match="hand_over: thread must be a threading"):
        comm.hand_over("worker")  # type: ignore[arg-type]


def test_two_threads_racing_on_one_communicator_never_give_a_wrong_sum(comm, xp):
    # Both threads call at once on every rank: only the owner's calls run, on every rank, so
    # each result is the sum of the same thread's values.
    n = 50
    sums: list[float] = []
    refused: list[int] = []

    def racer() -> None:
        for _ in range(n):
            try:
                comm.all_reduce(xp.full(1, 1000.0))
            except col.CommunicatorStateError:
                refused.append(1)

    thread = threading.Thread(target=racer, name="racer")
    thread.start()
    for _ in range(n):
        x = xp.full(1, 1.0)
        comm.all_reduce(x)
        sums.append(float(x[0]))
    thread.join(60)
    assert sums == [float(comm.size)] * n
    assert len(refused) == n


def test_work_issued_by_the_owner_may_be_waited_on_from_another_thread(comm, xp):
    x = xp.full(2, comm.rank + 1.0)
    work = comm.all_reduce(x, async_op=True)
    got: list = []
    assert _in_thread(lambda: got.append(work.wait())) is None
    result = got[0]
    np.testing.assert_array_equal(result.get() if hasattr(result, "get") else result,
                                  comm.size * (comm.size + 1) / 2)  # fmt: skip
