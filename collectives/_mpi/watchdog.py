"""Ends the job when a blocking MPI call outlasts its communicator's timeout.

A blocking MPI call (any collective on a communicator whose backend is ``blocking``:
``init(mpi_blocking=True)``) cannot be interrupted. :data:`WATCHDOG`, a daemon thread, reads
each watched backend's ``blocked_since`` (the monotonic time its blocking call began, 0.0
outside one) under the one deadline rule (:func:`collectives._core.deadline.overdue`): no cost per call. The
error that a caller would have got is printed, the flight record dumped where asked, and the
job aborted.

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
from .._safety.ending import abort_job


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
        while True:
            sleep(0.05)
            now = monotonic()
            for backend in list(self.backends):
                since, context = backend.blocked_since, backend._context
                if since and context is not None:
                    waited = overdue(since, context.timeout, now)
                    if waited is not None:
                        self._end(context, since, waited)

    @staticmethod
    def _end(context: Any, since: float, waited: float) -> None:
        call = Pending()
        call.info, call.start = context.current(), since
        error = context.timeout_error(call, waited)
        context.dump_flight_record()
        sys.stderr.write(
            f"[rank {MPI.COMM_WORLD.Get_rank()}] CollectiveTimeoutError: {error}\n"
            "A blocking MPI call cannot be interrupted (COLLECTIVES_MPI_BLOCKING=0 makes "
            "it non-blocking): aborting the job.\n"
        )
        abort_job(1)


WATCHDOG = _Watchdog()
