"""Ends the job when a blocking MPI call outlasts its communicator's timeout.

A blocking MPI call (any collective on a communicator whose backend is ``blocking``:
``init(mpi_blocking=True)``, the default on Open MPI and Intel MPI) cannot be interrupted.
:data:`WATCHDOG`, a daemon thread, reads each watched backend's ``blocked_since`` (the
monotonic time its blocking call began, 0.0 outside one) under the one deadline rule
(:func:`collectives._core.deadline.overdue`): no cost per call. When a call is overdue, or
another rank's failure notice arrives while this one is stuck (looked for after
:data:`LOOK_AFTER` seconds inside a call), the communicator is declared failed as a polled
wait would (the other ranks told, the error naming the ranks that never arrived from every
node's board; :mod:`collectives._safety.guard`), the error printed, the flight record dumped
where asked, and the job aborted :data:`GRACE` seconds later, so that the other ranks told
print theirs. Notices need ``MPI_THREAD_MULTIPLE`` (mpi4py's default); without it the error
names what this node's board shows.

Example:
    >>> from collectives._mpi.backend import MpiBackend
    >>> backend = MpiBackend(comm.mpi_comm, blocking=True)   # its collectives are blocking
    >>> WATCHDOG.watch(backend)     # as backend.attach does; held weakly
    >>> backend in WATCHDOG.backends
    True
"""

from __future__ import annotations

import sys
import threading
import weakref
from time import monotonic, sleep
from typing import Any

from mpi4py import MPI

from .._core.deadline import overdue
from .._core.work import Pending
from .._errors import CollectivesError, told_error
from .._safety.ending import abort_job

#: seconds inside a blocking call before the watchdog looks for other ranks' failure notices
LOOK_AFTER = 0.25
#: seconds between this rank's error printed and the job aborted, so that the ranks told
#: print theirs: a rank told begins its wait for the other nodes' views (up to
#: ``VIEWS_WAIT``) when its watchdog reads the notice, later than the teller; 1 s was too
#: short under Intel MPI on a loaded 2-core machine (2+1+2 nodes, one rank's error lost)
GRACE = 2.0


class _Watchdog:
    def __init__(self) -> None:
        self.backends: weakref.WeakSet = weakref.WeakSet()
        self._thread: threading.Thread | None = None

    def watch(self, backend: Any) -> None:
        """Watch the blocking calls of ``backend`` (``blocked_since``, ``_context``)."""
        self.backends.add(backend)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="collectives-watchdog")
            self._thread.daemon = True
            self._thread.start()

    def _run(self) -> None:
        notices = MPI.Query_thread() == MPI.THREAD_MULTIPLE
        while True:
            sleep(0.05)
            now = monotonic()
            for backend in list(self.backends):
                since, context = backend.blocked_since, backend._context
                if not since or context is None:
                    continue
                waited = overdue(since, context.timeout, now)
                if waited is not None:
                    self._end(context, since, waited, None, notices)
                elif notices and now - since > LOOK_AFTER:
                    told = context.peer_failure()
                    if told is not None:
                        self._end(context, since, now - since, told, notices)

    @staticmethod
    def _end(
        context: Any,
        since: float,
        waited: float,
        told: tuple[type[CollectivesError], str] | None,
        notices: bool,
    ) -> None:
        call = Pending()
        call.info, call.start = context.current(), since
        if told is None:
            error: CollectivesError = context.timeout_error(call, waited)
        else:
            error = told_error(call.call, told)
        if notices:
            context.declare_blocked(error, None if told is None else told[1])
        else:
            context.dump_flight_record()
        sys.stderr.write(
            f"[rank {MPI.COMM_WORLD.Get_rank()}] {type(error).__name__}: {error}\n"
            "A blocking MPI call cannot be interrupted (COLLECTIVES_MPI_BLOCKING=0 makes "
            "it non-blocking): aborting the job.\n"
        )
        sys.stderr.flush()
        if notices:
            sleep(GRACE)
        abort_job(1)


WATCHDOG = _Watchdog()
