"""Handles for operations in flight: what a backend returns (a ``Pending``; an
``MpiPending`` for one MPI request, which the MPI backend's calls and check mode's
comparisons wait on, on every backend) and what ``async_op`` users hold (a ``Work``).

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

from mpi4py import MPI

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

    def wait_issued(self, comm: Any) -> None:
        """``wait``, right after the call was issued, in the issuing thread (a synchronous
        call): a backend may reuse what it read while issuing (NCCL: the caller's stream)."""
        self.wait(comm)

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


#: tests between two yields of the core: a rank that shares its core
#: gives it up after every 8 tests, not after each one: 4 ranks on 2 cores waited 1.4x to
#: 2.2x as long yielding after each test (every MPI; some calls need a few tests in a row
#: to progress), and Intel MPI's ranks yielding after each test took twice as long as its
#: MPI_Wait (benchmarks/results/cpu-2core-2026-11-25-sendrecv/)
YIELD_EVERY = 8


class MpiPending(Pending):
    """One non-blocking MPI request; waiting polls it against the communicator's deadline.

    mpi4py requests do not keep their buffers alive, so the pending owns ``arrays``: the
    arguments handed to MPI, widened and staged copies included. While it is incomplete it
    also sits in its backend's ``in_flight``, so that a dropped ``Work`` cannot free them either.
    """

    request: MPI.Request = MPI.REQUEST_NULL
    in_flight: set | None = None
    finish: Callable[[], None] | None = None

    def __init__(
        self,
        request: MPI.Request,
        arrays: Any = None,
        in_flight: set | None = None,
        finish: Callable[[], None] | None = None,
    ):
        self.request = request
        self.arrays = arrays
        self.in_flight = in_flight
        self.finish = finish
        self.done = False
        self.start = time.monotonic()
        if in_flight is not None:
            in_flight.add(self)

    def test(self) -> bool:
        if not self.done and self.request.Test():
            self._complete()
        return self.done

    def synchronize(self, comm: Any) -> None:
        if self.done:
            return
        test = self.request.Test
        if test():  # a small call, most often: done at the first test
            self._complete()
            return
        # a rank that shares its core (yield_after 0) looks at the clock after its first test
        polls = 255 if comm.yield_after == 0 else 0
        yielding = False
        while not test():  # busy, as MPI's own blocking wait polls, then yielding the core
            polls += 1
            if polls & 255 == 0:
                yielding = self._waited(comm)
            elif yielding and polls % YIELD_EVERY == 0:
                os.sched_yield()
        self._complete()

    wait = wait_issued = synchronize  # MPI has no stream to order: waiting is blocking

    def _complete(self) -> None:
        if self.in_flight is not None:
            self.in_flight.discard(self)
        super()._complete()


class _Record(Pending):
    """A completed call of the flight recorder, read back from its books."""

    def __init__(self, info: tuple):
        self.info = info
        self.done = True
        self.state = "completed"
        self.start = self.end = info[4]


def recorded(entry: Any) -> Pending:
    """A flight recorder's entry as a ``Pending``: the entry itself, or, for a call that
    completed where it was made, its books ``(seq, call, shape, dtype, start)`` seen as one.

    Example:
        >>> recorded((3, "all_reduce", (2,), "float32", 0.0)).describe()
        'all_reduce #3 (shape (2,), float32)'
    """
    return _Record(entry) if type(entry) is tuple else entry


class Completed(MpiPending):
    """What a backend returns for a call that completed where it was made (a small call
    done at its first test, a blocking call), its ``finish`` already run: one shared object
    that holds nothing, so that such a call makes none. The flight recorder keeps the
    call's books instead (:func:`recorded` reads them back).

    Example:
        >>> steps = []
        >>> COMPLETED.then(lambda: steps.append("copied back"))  # runs now
        >>> steps, COMPLETED.test()
        (['copied back'], True)
    """

    done = True
    state = "completed"

    def __init__(self) -> None:  # one instance, whose attributes are never set
        pass


#: the one ``Completed``
COMPLETED = Completed()


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
    last = [recorded(entry) for entry in list(comm.recorder)[-5:]]
    recent = "; ".join(f"#{p.seq} {p.call} {p.state}" for p in last)
    return CollectiveTimeoutError(
        f"{pending.describe()} on rank {comm.rank} did not complete after {waited:.1f} s "
        f"(timeout {comm.timeout:g} s); the communicator (world ranks "
        f"{comm.mpi_comm_world_ranks()}) is aborted. {comm.progress_report()} "
        f"Last calls here: {recent}."
    )


__all__ = [
    "COMPLETED",
    "Completed",
    "MpiPending",
    "Pending",
    "Work",
    "chain",
    "recorded",
    "timeout_error",
]
