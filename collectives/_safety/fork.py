"""The communicators of this process, and whether it is a child forked from the process that
made them.

A forked child shares its parent's MPI state but is no MPI process of the job: a call it
made on a parent's communicator completed with the parent's peer (whose own call then got
the child's data), and the library's exit hooks, run in a child leaving with ``sys.exit(0)``,
ended the job. After a fork, every communicator of the child is marked unusable without any
MPI call (a call raises ``CommunicatorStateError``; ``close()`` is a no-op there), and the
hooks of :mod:`collectives._safety.exit`, :mod:`collectives._safety.abort` and the MPI backend do nothing in a child.

mpi4py calls ``MPI_Finalize`` after Python's exit handlers (``Py_AtExit``), and in a child
that talks to the launcher as if it were the rank (MPICH's hung reading its socket, and the
launcher ended the job with status 15). So a child's exit, once Python's exit handlers have
run, ends the process with ``os._exit`` and the exit code Python would give: that of
``sys.exit(status)``, 1 after an uncaught exception, else 0 (``raise SystemExit(n)`` written
out is not seen: it gives 0). ``os._exit`` in the child, as ``multiprocessing`` does, is
unchanged.

The fork handler is the one hook that importing collectives registers (every other waits for
the first ``init``): it changes nothing in this process, and a child forked before any
``init`` needs it already, since importing mpi4py initialised MPI.
"""

from __future__ import annotations

import atexit
import os
import sys
import weakref
from typing import Any

#: the process that imported collectives, whose MPI is the job's
_PID = os.getpid()
#: every communicator made in this process and not yet closed (see :func:`watch`)
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


def forked() -> bool:
    """Whether this process is a child forked from the one that imported collectives.

    Example:
        >>> forked()
        False
    """
    return os.getpid() != _PID


def watch(comm: Any) -> None:
    """Note a new communicator: ``comm.forked()`` is called in a forked child, and
    ``comm.leaving(how)`` at exit (:mod:`collectives._safety.exit`)."""
    _LIVE.add(comm)


def live() -> list[Any]:
    """The communicators of this process that are neither closed nor failed."""
    return [comm for comm in list(_LIVE) if not comm.closed]


def exit_code(status: Any) -> int:
    """The process exit code Python gives ``sys.exit(status)``.

    Example:
        >>> exit_code(None), exit_code(3), exit_code("bad input")
        (0, 3, 1)
    """
    if status is None:
        return 0
    if isinstance(status, int):
        return status & 0xFF if status >= 0 else 1
    return 1


class _Child:
    status: Any = None  # the last sys.exit argument in the child


def _in_child() -> None:
    for comm in list(_LIVE):
        comm.forked(_PID)
    parents_exit = sys.exit

    def exit(status: Any = None) -> Any:  # noqa: A001 - it replaces sys.exit
        _Child.status = status
        return parents_exit(status)

    exit.__doc__ = parents_exit.__doc__
    sys.exit = exit
    atexit.register(_leave_child)  # the last registered: the first to run


def _leave_child() -> None:
    """The child's other exit handlers, then its end without mpi4py's ``MPI_Finalize``."""
    atexit.unregister(_leave_child)
    atexit._run_exitfuncs()  # the others, in their order (none has run yet)
    code = 1 if getattr(sys, "last_value", None) is not None else exit_code(_Child.status)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    os._exit(code)


os.register_at_fork(after_in_child=_in_child)
