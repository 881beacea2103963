"""Ends the job when a blocking direct-path call outlasts its communicator's timeout.

A blocking MPI call (a synchronous collective on a communicator whose backend is
``blocking``: :mod:`._direct`) cannot be interrupted. :data:`WATCHDOG`, a daemon
thread, reads each watched communicator's newest flight-recorder entry (an
:class:`~._books.Entry`, whose ``end`` stays 0.0 until the call returns) under the one
deadline rule (:func:`._deadline.overdue`): no cost per call. The error that a caller would
have got is printed, the flight record dumped where asked, and the job aborted.

Example:
    >>> WATCHDOG.watch(context)     # the MPI backend's, when its calls are blocking
"""

from __future__ import annotations

import sys
import threading
import weakref
from time import monotonic, sleep
from typing import TYPE_CHECKING

from mpi4py import MPI

from ._books import Entry
from ._deadline import overdue
from ._progress import BLOCKING_CALLS
from ._stderr import let_the_launcher_read_stderr
from ._work import recorded

if TYPE_CHECKING:
    from ._backend import BackendContext

#: the calls that may be blocking MPI calls
BLOCKING = frozenset(BLOCKING_CALLS.values())


class _Watchdog:
    def __init__(self) -> None:
        self.contexts: weakref.WeakSet = weakref.WeakSet()
        self._thread: threading.Thread | None = None

    def watch(self, context: BackendContext) -> None:
        """Watch the calls of the communicator that gave its backend ``context``."""
        self.contexts.add(context)
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="collectives-watchdog")
            self._thread.daemon = True
            self._thread.start()

    def _run(self) -> None:
        while True:
            sleep(0.05)
            now = monotonic()
            for context in list(self.contexts):
                recorder = context.recorder
                entry = recorder[-1] if recorder else None
                if (
                    type(entry) is Entry
                    and entry.end == 0.0
                    and entry.call in BLOCKING
                    and (waited := overdue(entry.start, context.timeout, now)) is not None
                ):
                    self._end(context, entry, waited)

    @staticmethod
    def _end(context: BackendContext, entry: Entry, waited: float) -> None:
        error = context.timeout_error(recorded(entry), waited)
        context.dump_flight_record()
        sys.stderr.write(
            f"[rank {MPI.COMM_WORLD.Get_rank()}] CollectiveTimeoutError: {error}\n"
            "A blocking MPI call cannot be interrupted (COLLECTIVES_MPI_BLOCKING=0 makes "
            "it non-blocking): aborting the job.\n"
        )
        sys.stderr.flush()
        let_the_launcher_read_stderr()
        MPI.COMM_WORLD.Abort(1)


WATCHDOG = _Watchdog()
