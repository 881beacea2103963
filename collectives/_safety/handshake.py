"""Arrival under a timeout for the calls that make communicators (``init``, ``split``,
``hierarchical``, and so ``DeviceMesh``).

Making a communicator takes blocking MPI calls (``MPI_Comm_dup``, ``MPI_Comm_split``, ...),
which wait forever for a rank that never calls them. So every rank first checks in with rank 0
by non-blocking point-to-point messages, polled against the deadline: once all have, every rank
is inside the same call and the blocking steps complete. A rank that never arrives is named:
rank 0 knows who checked in; the others learn it from rank 0, or that rank 0 never answered.

Example:
    >>> arrive(MPI.COMM_WORLD, "init", timeout=600.0)   # every rank calls it
"""

from __future__ import annotations

import time

import numpy as np
from mpi4py import MPI

from .._errors import CollectiveTimeoutError

_TAG = 0x7C0
_NONE = -1  # "every rank arrived", in rank 0's answer


def arrive(comm: MPI.Comm, call: str, timeout: float, stamp: int = 0, tag: int = _TAG) -> None:
    """Return once every rank of ``comm`` has called it with this ``stamp``; past ``timeout``
    seconds raise ``CollectiveTimeoutError`` naming the ranks that did not.

    ``stamp`` tells a knock meant for this communicator from one left over from an earlier
    communicator whose MPI context was reused (a knock that was never received): the id the
    communicator's ranks agreed on.
    """
    size, rank = comm.Get_size(), comm.Get_rank()
    if size == 1:
        return
    start = time.monotonic()
    if rank == 0:
        got = np.zeros(size, np.int64)

        def listen(r: int) -> MPI.Request:
            return comm.Irecv([got[r : r + 1], MPI.INT64_T], r, tag)

        waiting = {r: listen(r) for r in range(1, size)}
        polls = 0
        while waiting:
            for r, request in list(waiting.items()):
                if request.Test():
                    if got[r] == stamp:
                        del waiting[r]
                    else:  # left over from an earlier communicator
                        waiting[r] = listen(r)
            if waiting and _overdue(polls := polls + 1, start, timeout):
                missing = sorted(waiting)
                _cancel(list(waiting.values()))
                answer = np.array([stamp, *missing[:15]] + [_NONE] * (15 - len(missing[:15])))
                for r in set(range(1, size)) - set(missing):  # tell those who came
                    comm.Isend([answer.astype(np.int64), MPI.INT64_T], r, tag + 1).Free()
                raise _late(call, rank, timeout, missing)
        answer = np.full(16, _NONE, np.int64)
        answer[0] = stamp
        sends = [comm.Isend([answer, MPI.INT64_T], r, tag + 1) for r in range(1, size)]
        MPI.Request.Waitall(sends)  # received: every rank is waiting for them
        return
    knock = np.array([stamp], np.int64)
    answer = np.zeros(16, np.int64)
    send = comm.Isend([knock, MPI.INT64_T], 0, tag)
    receive = comm.Irecv([answer, MPI.INT64_T], 0, tag + 1)
    polls = 0
    while True:
        if receive.Test():
            if answer[0] == stamp:
                break
            receive = comm.Irecv([answer, MPI.INT64_T], 0, tag + 1)  # an old answer
        elif _overdue(polls := polls + 1, start, timeout):
            _cancel([receive])
            raise _late(call, rank, timeout, None)
    send.Wait()  # rank 0 answered: it has the knock
    missing = [int(r) for r in answer[1:] if r != _NONE]
    if missing:
        raise _late(call, rank, timeout, missing)


def _overdue(polls: int, start: float, timeout: float) -> bool:
    """Every 256 polls: whether ``timeout`` has passed (then, yield the core a little)."""
    if polls & 255:
        return False
    if time.monotonic() - start > timeout:
        return True
    time.sleep(1e-4)
    return False


def _cancel(requests: list) -> None:
    for request in requests:
        if not request.Test():
            request.Cancel()
            request.Wait()


def _late(
    call: str, rank: int, timeout: float, missing: list[int] | None
) -> CollectiveTimeoutError:
    if missing is None:
        who = "rank 0 never said that every rank had arrived (rank 0 did not call it)"
    else:
        listed = ", ".join(str(r) for r in missing)
        who = (
            f"ranks that never called it: {listed}"
            if len(missing) > 1
            else (f"rank {listed} never called it")
        )
    return CollectiveTimeoutError(
        f"{call}: not every rank called it within the timeout ({timeout:g} s), seen from "
        f"rank {rank}: {who}"
    )
