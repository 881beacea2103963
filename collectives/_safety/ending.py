"""Ending the whole job from one rank: ``MPI_Abort``, once the launcher has read what this
rank wrote to its stderr, and then this process's own end.

``MPI_Abort`` asks the launcher to kill every rank. Open MPI's and Intel MPI's never return;
MPICH's returns once it has asked, and the process lives on until the launcher kills it. A
launcher that cannot be reached (a node's link cut) never does: Python would then run its
``atexit`` handlers (printing ``Exception ignored in atexit callback``) and ``MPI_Finalize``,
which waits for ranks that are gone, for ever. So the process ends itself right after the
abort, with the abort's code, running nothing more.

Example (the ``mpi4py`` module stood in for, as MPICH's returning ``MPI_Abort``)::

    >>> import os, subprocess, sys
    >>> script = (
    ...     "import types, atexit; from collectives._safety import ending\\n"
    ...     "world = types.SimpleNamespace(Abort=lambda code: print('Abort returned'))\\n"
    ...     "ending.MPI = types.SimpleNamespace(COMM_WORLD=world)\\n"
    ...     "atexit.register(print, 'atexit ran')\\n"
    ...     "ending.abort_job(3)\\n")
    >>> done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    >>> done.returncode, done.stdout, done.stderr
    (3, 'Abort returned\\n', '')
"""

from __future__ import annotations

import os
import sys
import time
from typing import NoReturn

from mpi4py import MPI


def abort_job(code: int) -> NoReturn:
    """``MPI_Abort`` the job with ``code`` after flushing this rank's output and letting the
    launcher read it; then end this process with ``code`` (no ``atexit``, no finalize)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # closed, or replaced by no stream
            pass
    let_the_launcher_read_stderr()
    MPI.COMM_WORLD.Abort(code)
    os._exit(code)  # MPICH's MPI_Abort returns (see the module's docstring)


def let_the_launcher_read_stderr(limit: float = 1.0) -> None:
    """Wait (at most ``limit`` seconds) until the launcher has read what this rank wrote to
    its stderr pipe: the abort kills the job, and a launcher killed first loses the traceback
    (seen with MPICH's in about 1 run of 60). Not a pipe (a file, a terminal): no wait."""
    deadline = time.monotonic() + limit
    try:
        import fcntl
        import termios

        while time.monotonic() < deadline:
            unread = fcntl.ioctl(2, termios.FIONREAD, b"\0\0\0\0")
            if int.from_bytes(unread, sys.byteorder) == 0:
                return
            time.sleep(1e-3)
    except (ImportError, OSError):  # not POSIX, or stderr is no pipe
        return
