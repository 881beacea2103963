"""Leaving the job: a non-zero ``sys.exit`` on one rank, or a rank that leaves holding a failed
communicator, ends the whole job instead of leaving the others to hang.

``sys.exit(n)`` raises ``SystemExit``, which ``sys.excepthook`` never sees: the other ranks
would wait in their next collective until its timeout. A rank that caught a
``CollectiveTimeoutError`` and then leaves normally would hang in ``MPI_Finalize`` (which waits
for every rank) while the rank it timed out on stays stuck. So, at exit (a Python ``atexit``
handler, which runs before mpi4py's ``MPI_Finalize``):

- after ``sys.exit(n)`` with ``n`` not 0 (or a message, which Python turns into 1): wait
  :data:`EXIT_GRACE` seconds at the exit barrier below; if every rank leaves too, the job
  ends without an abort (each process with its own code); otherwise print it and
  ``MPI_Abort`` the job with that code, as ``python -m mpi4py`` does;
- otherwise every rank that made a communicator meets the others at an exit barrier (a
  non-blocking one, on a duplicate of the world made by the first ``init``). A rank that holds
  a failed communicator waits there at most that communicator's timeout, then prints why and
  aborts the job with exit code 1; a rank with none waits as ``MPI_Finalize`` would have.
  When every rank arrives, the job ends as usual: the program handled its failure.
- a rank that leaves normally (``sys.exit(0)``, or the end of the program) while others have
  not reached the exit within :data:`EXIT_GRACE` tells every rank of its open communicators
  that it left (a failure notice, :mod:`collectives._safety.guard`): a rank waiting in a collective it will
  never make raises ``CommunicatorStateError`` naming the exit (and, uncaught, ends the job).
  A rank of the node inside a blocking MPI call past this rank's last collective cannot see
  that notice: then this rank aborts the job (exit code 1), naming its exit and that call.
  Ranks busy elsewhere are waited for, as ``MPI_Finalize`` would.

Nothing of this runs in a child forked from a rank (:mod:`collectives._safety.fork`): it is no MPI process.

On when ``COLLECTIVES_ABORT_ON_EXCEPTION`` is (see :mod:`collectives._safety.abort`). ``raise SystemExit(n)``
written out is not seen (only ``sys.exit``): Python gives no hook for it.
"""

from __future__ import annotations

import atexit
import sys
import time
from typing import Any, NoReturn

from mpi4py import MPI

from . import fork as _fork
from .ending import abort_job
from .fork import exit_code

FAILED_EXIT_CODE = 1
#: seconds a rank that called ``sys.exit(n)`` waits for the others at the exit barrier: when
#: every rank leaves (each with its own code), the job ends without an abort, which could
#: cut off what the others were still printing
EXIT_GRACE = 1.0


class _State:
    installed = False
    exit_code: Any = None  # the last sys.exit argument, when sys.exit was called
    world: MPI.Comm | None = None  # the exit barrier's communicator
    failure: BaseException | None = None  # the first failure of a communicator here
    failure_timeout = 0.0


_STATE = _State()


def install() -> None:
    """Wrap ``sys.exit`` and register the exit handler (once).

    Example:
        >>> from collectives._safety.exit import install
        >>> install()          # doctest: +SKIP
    """
    if _STATE.installed:
        return
    _STATE.installed = True
    original = sys.exit

    def exit(status: Any = None) -> NoReturn:  # noqa: A001 - it replaces sys.exit
        _STATE.exit_code = status
        original(status)

    exit.__doc__ = original.__doc__
    sys.exit = exit
    atexit.register(_at_exit)


def enrol(world: MPI.Comm) -> None:
    """Called by every ``init`` (a collective over the world): the first one duplicates the
    world for the exit barrier, on every rank at the same point."""
    if _STATE.installed and _STATE.world is None and world.Get_size() > 1:
        _STATE.world = world.Dup()


def failed(error: BaseException, timeout: float) -> None:
    """Note that a communicator of this process failed (the first failure is kept)."""
    if _STATE.failure is None:
        _STATE.failure = error
    _STATE.failure_timeout = max(_STATE.failure_timeout, timeout)


def _at_exit() -> None:
    if _fork.forked() or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    code = exit_code(_STATE.exit_code)
    comm = _STATE.world
    if code != 0 and size > 1:
        if comm is None or not _every_rank_leaves(comm, EXIT_GRACE):
            _abort(
                f"[rank {rank}] sys.exit({_STATE.exit_code!r}) on one rank of {size}, "
                f"aborting the job with exit code {code}\n",
                code,
            )
        _free_world(comm)  # every rank is leaving: MPI_Finalize, then this exit code
        return
    if comm is None:
        return
    failure, limit = _STATE.failure, _STATE.failure_timeout
    request = comm.Ibarrier()
    start = time.monotonic()
    told = looked = 0.0
    how = (
        "the end of the program" if _STATE.exit_code is None else f"sys.exit({_STATE.exit_code!r})"
    )
    while not request.Test():
        now = time.monotonic()
        if failure is not None and now - start > limit:
            _abort(
                f"[rank {rank}] leaving with a failed communicator ({failure}); not every rank "
                f"reached the exit within {limit:g} s, and MPI_Finalize would wait for them "
                f"forever: aborting the job with exit code {FAILED_EXIT_CODE}\n",
                FAILED_EXIT_CODE,
            )
        if not told and now - start > EXIT_GRACE:
            told = now
            for live in _fork.live():
                live.leaving(how)
        if told and now - looked > 0.05:
            looked = now
            _abort_if_stuck(rank, how)
        time.sleep(1e-3)
    _free_world(comm)


def _abort_if_stuck(rank: int, how: str) -> None:
    """Abort the job where a rank of the node is inside a blocking call that this rank, which
    left, never made (it can neither complete nor see the notice)."""
    for live in _fork.live():
        stuck = live.stuck_past()
        if stuck is not None:
            _abort(
                f"[rank {rank}] left the program ({how}) while {stuck}, a collective this "
                f"rank never made: aborting the job with exit code {FAILED_EXIT_CODE}\n",
                FAILED_EXIT_CODE,
            )


def _every_rank_leaves(comm: MPI.Comm, limit: float) -> bool:
    """Whether every rank reaches the exit barrier within ``limit`` seconds."""
    request = comm.Ibarrier()
    deadline = time.monotonic() + limit
    while not request.Test():
        if time.monotonic() > deadline:
            return False
        time.sleep(1e-3)
    return True


def _free_world(comm: MPI.Comm) -> None:
    comm.Free()
    _STATE.world = None


def _abort(message: str, code: int) -> NoReturn:
    sys.stderr.write(message)
    abort_job(code)
