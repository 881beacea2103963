"""Opt-in: an uncaught exception on any rank aborts the whole MPI job instead of a hang."""

from __future__ import annotations

import sys
import traceback
from typing import Any

from mpi4py import MPI


def abort_on_exception(exit_code: int = 1) -> None:
    """Make an uncaught exception on this rank print once and ``MPI_Abort`` the whole job.

    Without it, the other ranks wait in their next collective (until its timeout). Call it
    once at start-up on every rank, or set ``COLLECTIVES_ABORT_ON_EXCEPTION=1``.

    Example:
        >>> import collectives as col
        >>> col.abort_on_exception()
    """
    previous = sys.excepthook

    def hook(kind: Any, value: Any, tb: Any) -> None:
        if issubclass(kind, KeyboardInterrupt):
            previous(kind, value, tb)
        rank = MPI.COMM_WORLD.Get_rank()
        text = "".join(traceback.format_exception(kind, value, tb))
        sys.stderr.write(f"[rank {rank}] uncaught exception, aborting the job:\n{text}")
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(exit_code)

    sys.excepthook = hook
