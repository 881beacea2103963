"""An uncaught exception on any rank of a job of several ranks aborts the whole job.

Without it, the other ranks would wait in their next collective until its timeout, and under
Open MPI the raising rank itself would hang in ``MPI_Finalize``. torchrun and horovodrun end
a job whose worker failed; this does the same. The first ``init`` installs it
(:func:`install_default`; importing collectives installs nothing):
``COLLECTIVES_ABORT_ON_EXCEPTION=0`` turns that default off, ``=1`` turns it on at any world
size.
"""

from __future__ import annotations

import os
import sys
import traceback
from typing import Any

from mpi4py import MPI

from . import fork as _fork
from .ending import abort_job


def abort_on_exception(exit_code: int = 1) -> None:
    """Make an uncaught exception on this rank print once and ``MPI_Abort`` the whole job;
    so do ``sys.exit(n)`` with ``n`` not 0 and leaving with a failed communicator (:mod:`collectives._safety.exit`).

    On by default, from the first ``init``, when the world has more than one rank (see
    :func:`install_default`); calling it again changes nothing.

    Example:
        >>> import collectives as col
        >>> col.abort_on_exception()     # doctest: +SKIP
    """
    previous = sys.excepthook
    if getattr(previous, "_aborts_the_job", False):
        return

    def hook(kind: Any, value: Any, tb: Any) -> None:
        if _fork.forked():  # a forked child is no MPI process: its end is its own
            previous(kind, value, tb)
            return
        rank = MPI.COMM_WORLD.Get_rank()
        if issubclass(kind, KeyboardInterrupt):
            previous(kind, value, tb)  # the usual one-line report, printed once
            sys.stderr.write(f"[rank {rank}] interrupted, aborting the job\n")
        else:
            text = "".join(traceback.format_exception(kind, value, tb))
            sys.stderr.write(f"[rank {rank}] uncaught exception, aborting the job:\n{text}")
        abort_job(exit_code)

    hook._aborts_the_job = True  # type: ignore[attr-defined]
    sys.excepthook = hook
    from .exit import install

    install()  # sys.exit(n), and leaving with a failed communicator, end the job too


#: whether :func:`install_default` has run (it decides once)
_DEFAULT_DECIDED: list[bool] = []


def install_default() -> None:
    """Install :func:`abort_on_exception` as ``COLLECTIVES_ABORT_ON_EXCEPTION`` says: ``0``
    off, ``1`` on, unset on when ``MPI.COMM_WORLD`` has more than one rank. Called by every
    ``init``, before anything else; only the first call decides."""
    if _DEFAULT_DECIDED:
        return
    _DEFAULT_DECIDED.append(True)
    wanted = os.environ.get("COLLECTIVES_ABORT_ON_EXCEPTION", "")
    if wanted == "":
        if MPI.COMM_WORLD.Get_size() > 1:
            abort_on_exception()
    elif wanted != "0":
        abort_on_exception()
