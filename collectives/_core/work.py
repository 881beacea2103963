"""Handles for operations in flight: what a backend returns (a ``Pending``) and what
``async_op`` users hold (a ``Work``).

A ``Work`` holds the backend's ``Pending`` and the communicator's backend context
(:class:`~collectives._core.backend.BackendContext`), whose ``complete`` finishes it under the
communicator's rules (the timeout, the failure of a peer).

Example:
    >>> work = comm.all_reduce(grad, async_op=True)
    >>> # ... overlap other work
    >>> work.wait()               # grad now holds the sum (here, of one rank)
    array([1., 1., 1., 1.], dtype=float32)
"""

from __future__ import annotations

import math
import os
import time
from typing import Any, Callable

from .. import _timeline
from .._dtypes import STORAGE
from .._errors import CollectiveTimeoutError
from .deadline import overdue


class Pending:
    """One operation in flight, and the flight recorder's entry for it. Backends subclass it.

    ``test()`` polls, ``wait()`` orders the caller after the result (MPI: blocks),
    ``synchronize()`` blocks the host. ``finish`` runs once, after completion (host-side
    post-processing such as the division of AVG on MPI or the copy back of staged arrays).
    ``arrays`` holds whatever the library may still read or write (inputs, outputs, widened
    and staged copies) until completion; a backend that abandons an operation keeps it longer.
    The front end fills in ``info``: (seq, call, shape, dtype), one tuple per call.
    """

    # Class-level defaults: creating one (once per call) sets only what differs.
    info: tuple = (0, "operation", None, None)
    end = 0.0
    state = "started"
    track = 0
    arrays: Any = None
    posted: Any = None  # the progress board this wait is posted on, if it lasted

    @property
    def seq(self) -> int:
        return self.info[0]

    @property
    def call(self) -> str:
        return self.info[1]

    @property
    def shape(self) -> tuple | None:
        return self.info[2]

    @property
    def dtype(self) -> str | None:
        return self.info[3]

    def __init__(self, finish: Callable[[], None] | None = None):
        self.finish = finish
        self.done = False
        self.start = time.monotonic()

    def then(self, step: Callable[[], None]) -> None:
        """Run ``step`` once this call has completed (after its ``finish``): now if it has."""
        if self.done:
            step()
        else:
            self.finish = chain(self.finish, step)

    def test(self) -> bool:
        raise NotImplementedError

    def wait(self, comm: Any) -> None:
        self.synchronize(comm)

    def synchronize(self, comm: Any) -> None:
        raise NotImplementedError

    def _waited(self, comm: Any) -> bool:
        """For host-side waits that poll, every 256 polls: past ``comm.yield_after`` seconds
        yield the core, past 1 s sleep between polls, past the timeout raise
        ``CollectiveTimeoutError`` (the front end then declares the communicator dead); once
        another rank has declared it failed, raise the class of that rank's error, naming it.
        Whether it is past ``yield_after`` (the polls between may yield the core too)."""
        waited = time.monotonic() - self.start
        if waited > comm.yield_after:
            comm.check_peers(self.call)  # another rank may have declared it failed
            if not self.posted:  # a wait that lasts: say on the progress board what it is in
                self.posted = comm.post_waiting(self)
            if overdue(self.start, comm.timeout, self.start + waited) is not None:
                raise timeout_error(comm, self, waited)
            if waited > 1.0:
                time.sleep(1e-3)
            else:
                os.sched_yield()
            return True
        return False

    def _complete(self) -> None:
        self.done = True
        if self.finish is not None:
            finish, self.finish = self.finish, None
            finish()
        self.arrays = None
        if self.posted is not None:
            self.posted.done_waiting()
        if self.state == "started":  # a call that timed out and was aborted stays so
            self.state = "completed"
        self.end = time.monotonic()
        if _timeline.TIMELINE is not None and self.track:
            _timeline.TIMELINE.pending(self, self.track)

    @property
    def nbytes(self) -> int:
        if self.shape is None or self.dtype is None:
            return 0
        return math.prod(self.shape) * STORAGE[self.dtype].itemsize

    @property
    def detail(self) -> str:
        return "no data" if self.shape is None else f"shape {self.shape}, {self.dtype}"

    def describe(self) -> str:
        return f"{self.call} #{self.seq} ({self.detail})"

    def as_dict(self) -> dict:
        return {
            "seq": self.seq,
            "call": self.call,
            "nbytes": self.nbytes,
            "shape": self.shape,
            "dtype": self.dtype if self.shape is not None else None,
            "state": self.state,
            "start": self.start,
            "duration_s": (self.end or time.monotonic()) - self.start,
        }


class Work:
    """The result of a call made with ``async_op=True``.

    Example:
        >>> work = comm.all_reduce(grad, async_op=True)
        >>> # ... overlap other work
        >>> work.wait()               # grad now holds the sum (here, of one rank)
        array([1., 1., 1., 1.], dtype=float32)
    """

    __slots__ = ("_context", "_pending", "_result")

    def __init__(self, context: Any, pending: Pending | None, result: Any):
        self._context = context  # the communicator's BackendContext
        self._pending = pending
        self._result = result

    def wait(self) -> Any:
        """Order the caller after the result (NCCL: the current stream; MPI: block until
        done, under the timeout); the result."""
        pending = self._pending
        if pending is not None and not pending.done:
            self._context.complete(pending, block=False)
        return self._result

    def synchronize(self) -> Any:
        """Block the host until the operation has finished (the timeout applies); the
        result."""
        pending = self._pending
        if pending is not None and not pending.done:
            self._context.complete(pending)
        return self._result

    def is_completed(self) -> bool:
        """True once the operation has finished (never blocks)."""
        pending = self._pending
        return pending is None or pending.done or pending.test()

    @property
    def event(self) -> Any:
        """The CUDA event the operation completes with on the NCCL backend, or None (MPI, or
        a call still held by an open ``comm.group()``)."""
        return getattr(self._pending, "event", None)

    @property
    def result(self) -> Any:
        """The output array (valid once waited)."""
        return self._result


def chain(first: Callable[[], None] | None, then: Callable[[], None]) -> Callable[[], None]:
    """One step that runs ``first``, then ``then`` (``then`` alone where there is no
    ``first``): how finish steps add up.

    Example:
        >>> steps = []
        >>> chain(lambda: steps.append("reduce"), lambda: steps.append("avg"))()
        >>> steps
        ['reduce', 'avg']
    """
    if first is None:
        return then

    def both() -> None:
        first()
        then()

    return both


def timeout_error(comm: Any, pending: Pending, waited: float) -> CollectiveTimeoutError:
    pending.state = "timed out"
    last = list(comm.recorder)[-5:]
    recent = "; ".join(f"#{p.seq} {p.call} {p.state}" for p in last)
    return CollectiveTimeoutError(
        f"{pending.describe()} on rank {comm.rank} did not complete after {waited:.1f} s "
        f"(timeout {comm.timeout:g} s); the communicator (world ranks "
        f"{comm.mpi_comm_world_ranks()}) is aborted. {comm.progress_report()} "
        f"Last calls here: {recent}."
    )


__all__ = ["Pending", "Work", "chain", "timeout_error"]
