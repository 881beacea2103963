"""Waiting for the launcher to read this rank's stderr before an abort ends the job."""

from __future__ import annotations

import sys
import time


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
