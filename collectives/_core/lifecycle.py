"""What a :class:`~collectives.Communicator` is apart from its calls: which thread owns it,
how it closes, how it fails (declared dead here or by another rank, and the flight record
it leaves), and what a wait says on the progress board.

:class:`Lifecycle` is a base of ``Communicator``, which sets the attributes declared here.

Example:
    >>> comm = col.init()
    >>> worker = threading.Thread(target=lambda: comm.all_reduce(comm.xp.ones(4)))
    >>> comm.hand_over(worker)     # only worker may issue calls from now on
    >>> worker.start(); worker.join()
    >>> comm.close()               # or comm.abort(): no waiting for calls in flight
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from typing import Any, NoReturn

from mpi4py import MPI

from .._errors import (
    CollectivesError,
    CollectiveTimeoutError,
    CommunicatorStateError,
    InvalidArgumentError,
    event_name,
)
from .._safety import exit as _exit
from .._safety.handshake import arrive
from .._safety.progress import ProgressBoard, across_nodes
from .backend import Backend
from .books import IN_USE, CallBooks
from .work import Pending

_get_ident = threading.get_ident

#: seconds (at most; at most the timeout) that a rank whose call timed out, or which was told
#: of a timeout, waits for the other nodes' boards: a rank told passes the notice on at its
#: wait's next look for notices (every 0.3 s or so; more on a loaded machine)
VIEWS_WAIT = 2.0


class Lifecycle:
    """Ownership, closing and failure of a communicator (a base of ``Communicator``)."""

    rank: int
    size: int
    timeout: float
    device: int | None
    mpi_comm: MPI.Comm
    recorder: Any
    _impl: Backend
    _books: CallBooks
    _progress: ProgressBoard | None
    _world_ranks: list[int]
    _unusable: CollectivesError | None
    _failed: bool
    _owner_thread: threading.Thread
    _owner: int | None

    def hand_over(self, thread: threading.Thread) -> None:
        """Make ``thread`` the only one that may issue calls on this communicator from now on.

        A communicator belongs to the thread that made it; a call from any other thread raises
        ``CommunicatorStateError`` (on every rank alike, before any communication). Only the
        owner may hand it over, between calls (async work it issued may still be waited on from
        any thread); every rank should hand it over at the same point of its program. Local:
        nothing is communicated.

        On NCCL the thread must make the communicator's GPU current before it makes arrays
        (CUDA's current device is per thread): :meth:`device_scope`.

        Example:
            >>> def train(comm):
            ...     with comm.device_scope():
            ...         comm.all_reduce(comm.xp.ones(4))
            >>> comm = col.init()
            >>> worker = threading.Thread(target=train, args=(comm,))
            >>> comm.hand_over(worker)     # before worker.start() is fine
            >>> comm.barrier()             # this thread's calls are refused from now on
            Traceback (most recent call last):
            collectives._errors.CommunicatorStateError: barrier: called from thread 'MainThread', but the communicator belongs to thread 'Thread-...' ...
            >>> worker.start()             # train starts with `with comm.device_scope():`
            >>> worker.join(); comm.close()
        """
        if not isinstance(thread, threading.Thread):
            raise InvalidArgumentError(
                f"hand_over: thread must be a threading.Thread, got {type(thread).__name__}"
            )
        self._own("hand_over")
        if self._books.busy:
            raise CommunicatorStateError(f"hand_over: {IN_USE}")
        self._owner_thread, self._owner = thread, thread.ident

    def device_scope(self) -> contextlib.AbstractContextManager:
        """Make the communicator's GPU the calling thread's current device for a with-block.

        CUDA's current device is per host thread and starts at 0 in every new thread, and
        CuPy allocates there: a thread handed a communicator on device 1 must make it current
        before it makes arrays, or its calls are refused ("x is on device 0, expected device
        1"). On the MPI backend (no device) it does nothing.

        Example:
            >>> def train(comm):
            ...     with comm.device_scope():   # first thing in the thread
            ...         x = comm.xp.ones(4)
            ...         comm.all_reduce(x)
            >>> comm = col.init()
            >>> worker = threading.Thread(target=train, args=(comm,))
            >>> comm.hand_over(worker)
            >>> worker.start()
            >>> worker.join(); comm.close()
        """
        if self.device is None:
            return contextlib.nullcontext()
        import cupy

        return cupy.cuda.Device(self.device)

    @property
    def owner(self) -> threading.Thread:
        """The thread that may issue calls on this communicator (see :meth:`hand_over`)."""
        return self._owner_thread

    def _own(self, call: str) -> None:
        """Raise ``CommunicatorStateError`` unless the calling thread owns the communicator."""
        ident = _get_ident()
        if ident == self._owner:
            return
        owner = self._owner_thread
        if self._owner is None and owner.ident == ident:  # handed over before it started
            self._owner = ident
            return
        raise CommunicatorStateError(
            f"{call}: called from thread {threading.current_thread().name!r}, but the "
            f"communicator belongs to thread {owner.name!r} (the thread that made it, or that "
            "comm.hand_over() gave it to); every rank refuses such a call alike, so that no "
            "rank matches one thread's call with another thread's"
        )

    def close(self) -> None:
        """Free the communicator, once the calls in flight have finished (waiting at most the
        timeout for them). Idempotent; every rank should call it."""
        if isinstance(self._unusable, _Closed):
            return
        if self._unusable is None:
            self._impl.drain()
        self._impl.close()  # first: a backend that refuses (NCCL inside a group) leaves it open
        self._unusable = _Closed("communicator is closed")
        self._free_mpi()

    def abort(self) -> None:
        """Tear the communicator down without waiting for operations in flight."""
        if isinstance(self._unusable, _Closed):
            return
        self._unusable = _Closed("communicator was aborted")
        self._impl.abort()
        self._free_mpi()

    @property
    def closed(self) -> bool:
        return self._unusable is not None

    def forked(self, parent: int) -> None:
        """In a child forked from process ``parent`` (:mod:`collectives._safety.fork`): unusable from now on,
        and closing it does nothing; no MPI call is made (MPI is the parent's)."""
        self._unusable = _Closed(
            f"communicator belongs to process {parent}, and this process ({os.getpid()}) is "
            "a child forked from it: MPI cannot be used in a forked child"
        )

    def leaving(self, how: str) -> None:
        """At exit, while other ranks have not all reached it (:mod:`collectives._safety.exit`): tell them that
        this rank left; their waits on this communicator then raise
        ``CommunicatorStateError`` naming it (a rank gone is the communicator's state).
        Local: one small message to each rank."""
        guard = self._books.checker
        if self._unusable is not None or guard is None:
            return
        nth = self._books.seq - self._books.p2p
        guard.announce(
            CommunicatorStateError.__name__,
            f"rank {self.rank} (world rank {self._world_ranks[self.rank]}) left the program "
            f"({how}) after collective #{nth} of this communicator: no later collective on it "
            "can complete",
        )

    def stuck_past(self) -> str | None:
        """A rank of this node inside a blocking call for a collective that this rank, which
        is leaving, never made: it can neither complete nor see a notice (:mod:`collectives._safety.exit`)."""
        board = self._progress
        if self._unusable is not None or board is None:
            return None
        return board.inside_after(self._books.seq - self._books.p2p)

    def mpi_comm_world_ranks(self) -> list[int]:
        """The ``MPI.COMM_WORLD`` ranks of this communicator's members, in rank order.
        Computed at creation: a watchdog thread reads it, and MPI may be called from
        other threads only under ``MPI_THREAD_MULTIPLE``."""
        return list(self._world_ranks)

    def post_waiting(self, pending: Pending) -> Any:
        """Say on the progress board which call this rank waits in (a wait that lasts calls
        it); the board, or None."""
        board = self._progress
        if board is not None:
            board.waiting(f"{pending.call} ({pending.detail})")
        return board

    def progress_report(self) -> str:
        """Which ranks have not reached this rank's latest call (those on this node)."""
        board = self._progress
        return "" if board is None else board.report()

    def _fatal(self, error: CollectivesError) -> None:
        """A wait that timed out, or a backend that raises the error that ended it (and keeps
        it as ``failure``): from then on this communicator is dead too. Backends raise; only
        the front end declares the communicator dead."""
        if isinstance(error, CollectiveTimeoutError) or error is self._impl.failure:
            self._die(error)

    def _mpi_error(self, call: str, error: MPI.Exception) -> NoReturn:
        """An MPI error raised as a ``CollectivesError`` naming the call and the error; the
        communicator is dead (MPI leaves it in no known state), and the other ranks are told."""
        wrapped = CollectivesError(
            f"{call}: MPI error {error.Get_error_class()} on rank {self.rank}: "
            f"{error.Get_error_string().strip()}; the communicator is unusable"
        )
        wrapped.__cause__ = error
        self._die(wrapped)
        raise wrapped  # _die raised already; for the type checker

    def arrive(self, call: str) -> None:
        """Before blocking MPI steps that every rank takes (making communicators): return
        once all ranks have arrived, or raise ``CollectiveTimeoutError`` naming those that did
        not, the communicator dead (:mod:`collectives._safety.handshake`). Every rank calls it.

        Example:
            >>> comm.arrive("hierarchical")     # then split: no rank blocks in MPI for ever
        """
        guard = self._books.checker
        try:  # on the guard's private communicator: no user message can match it
            if guard is None or guard.notice.mpi == MPI.COMM_NULL:  # none in a world of one
                arrive(self.mpi_comm, call, self.timeout)
            else:
                arrive(guard.notice.mpi, call, self.timeout, stamp=guard.notice.id)
        except CollectiveTimeoutError as e:
            self._die(e)

    def check_peers(self, call: str) -> None:
        """If another rank declared the communicator failed (:mod:`collectives._safety.guard`), raise the class
        of its error, naming it (``CollectiveTimeoutError`` for a timeout: one class per
        event, :mod:`._errors`), the communicator dead; a wait that lasts calls it."""
        guard = self._books.checker
        notice = None if guard is None or self._unusable is not None else guard.failure()
        if notice is not None:
            kind, text = notice
            self._die(kind(f"{call}: communicator is unusable: {text}"), told=text)

    def _die(self, error: CollectivesError, told: str | None = None) -> None:
        """Mark the communicator dead after a timeout, abort the backend, raise ``error``;
        tell the other ranks unless they told this one (``told``: the text of their notice;
        the notice carries the class of ``error``, which they raise). After a timeout on
        several nodes, the error names the ranks that never arrived from every node's board
        (:meth:`_name_the_missing`)."""
        self._declare(error, told)
        raise error

    def peer_failure(self) -> tuple[type[CollectivesError], str] | None:
        """The class and text of another rank's failure notice, once one has arrived; None
        while none has (or where there are no notices). The watchdog of blocking calls asks
        from its own thread while this rank is inside a blocking MPI call."""
        guard = self._books.checker
        return None if guard is None or self._unusable is not None else guard.failure()

    def declare_blocked(self, error: CollectivesError, told: str | None = None) -> None:
        """What :meth:`_die` does, without raising, for a call stuck in a blocking MPI call
        (the watchdog's thread calls it, then ends the job): the other ranks told, or the
        notice that told this one (``told``) passed on with this node's view, and ``error``
        naming the ranks that never arrived from every node's board."""
        self._declare(error, told)

    def _declare(self, error: CollectivesError, told: str | None) -> None:
        if self._unusable is None:
            self._unusable = error
            self._failed = True
            _exit.failed(error, self.timeout)
            guard, board = self._books.checker, self._progress
            across = (
                isinstance(error, CollectiveTimeoutError)
                and guard is not None
                and board is not None
                and len(board.members) < self.size
            )
            view = board.view() if across and board is not None else None
            if guard is not None and told is None:
                world = self._world_ranks[self.rank]
                guard.announce(
                    event_name(error),
                    f"rank {self.rank} (world rank {world}) declared it failed: {error}",
                    view,
                )
            elif guard is not None and across:  # passed on, with this node's view
                guard.announce(event_name(error), told, view)
            if across:
                self._name_the_missing(error)
            self._dump_flight_record()
            self._impl.abort()

    def _name_the_missing(self, error: CollectivesError) -> None:
        """Add to ``error`` which ranks never arrived, from the boards of every node: this
        node's, and the views that the other nodes' notices bring (waited for at most
        :data:`VIEWS_WAIT` seconds, as long as this rank's own notice has not left for every
        rank that reached the call, which needs its view); a rank on no board that answered is
        found by elimination (:func:`._safety.progress.across_nodes`)."""
        guard, board = self._books.checker, self._progress
        assert guard is not None and board is not None
        deadline = time.monotonic() + min(VIEWS_WAIT, self.timeout)
        while True:
            guard.failure()  # receives every notice that arrived, and its view
            views = dict(guard.notice.views)
            for rank, nth in board.view().items():  # this node's, the freshest
                views[rank] = max(nth, views.get(rank, 0))
            furthest = max(views.values())
            arrived = {rank for rank, nth in views.items() if nth == furthest}
            complete = len(views) >= self.size and guard.notice.delivered(arrived)
            if complete or time.monotonic() > deadline:
                break
            time.sleep(1e-3)
        error.args = (f"{error} {across_nodes(views, self.size)}",)

    def flight_record(self) -> list[dict]:
        """The last calls on this communicator, oldest first (seq, call, bytes, state, timing)."""
        return [p.as_dict() for p in self.recorder]

    def _dump_flight_record(self) -> None:
        folder = os.environ.get("COLLECTIVES_FLIGHT_RECORDER")
        if folder:
            path = os.path.join(folder, f"flight-recorder.rank{MPI.COMM_WORLD.Get_rank()}.json")
            with open(path, "w") as f:
                json.dump(
                    {"rank": self.rank, "size": self.size, "calls": self.flight_record()},
                    f,
                    indent=1,
                    default=str,
                )

    def _unusable_error(self, call: str) -> CollectivesError:
        reason = self._unusable
        if isinstance(reason, _Closed):
            return CommunicatorStateError(f"{call}: {reason} (rank {self.rank})")
        return CommunicatorStateError(
            f"{call}: communicator is unusable after an earlier error: {reason}"
        )

    def ensure_usable(self, call: str) -> None:
        """Raise ``CommunicatorStateError`` naming ``call`` if the communicator is closed or
        dead (local: nothing is communicated)."""
        if self._unusable is not None:
            raise self._unusable_error(call)

    def _free_mpi(self) -> None:
        if self._progress is not None:
            self._books.forget_board()  # the books hold its words
            self._progress.close()
            self._progress = None
        # A communicator with calls still in flight is left to MPI_Finalize: freeing it under
        # a pending collective crashes Open MPI when the request is next tested. So is one
        # that failed: another rank may still have calls in flight on it (a rank that raised
        # an argument error before posting its gather leaves its peers' sends pending), and
        # Open MPI's next communicator then met the wrong peers' messages.
        if self.mpi_comm != MPI.COMM_NULL and not self._impl.unfinished and not self._failed:
            self.mpi_comm.Free()
        if self._books.checker is not None:
            self._books.checker.close(failed=self._failed)


def world_ranks(mpi_comm: MPI.Comm, size: int) -> list[int]:
    """The ``MPI.COMM_WORLD`` ranks of ``mpi_comm``'s members, in rank order."""
    try:
        group, world = mpi_comm.Get_group(), MPI.COMM_WORLD.Get_group()
        try:
            return list(MPI.Group.Translate_ranks(group, list(range(size)), world))
        finally:
            group.Free()
            world.Free()
    except Exception:
        return list(range(size))


class _Closed(CollectivesError):
    pass
