"""What a :class:`~collectives.Communicator` is apart from its calls: which thread owns it,
how it closes, how it fails (declared dead here or by another rank, and the flight record
it leaves), and what a wait says on the progress board.

A ``Communicator`` holds one :class:`Lifecycle` and hands its public words on to it.

Example:
    >>> comm = col.init()
    >>> worker = threading.Thread(target=lambda: comm.all_reduce(comm.xp.ones(4)))
    >>> comm.hand_over(worker)     # only worker may issue calls from now on
    >>> worker.start(); worker.join()
    >>> comm.close()               # or comm.abort(): no waiting for calls in flight
"""

from __future__ import annotations

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
    told_error,
)
from .._safety import exit as _exit
from .._safety.handshake import arrive
from .._safety.progress import ProgressBoard, across_nodes
from .backend import Backend
from .books import IN_USE, CallBooks
from .work import Pending, recorded

_get_ident = threading.get_ident

#: seconds (at most; at most the timeout) that a rank whose call timed out, or which was told
#: of a timeout, waits for the other nodes' boards: a rank told passes the notice on at its
#: wait's next look for notices (every 0.3 s or so; more on a loaded machine)
VIEWS_WAIT = 2.0


class Lifecycle:
    """Ownership, closing and failure of one communicator: the state that says whether a
    call may go ahead, and every way it ends.

    Args:
        mpi_comm: the communicator's MPI communicator (freed at its close).
        rank, size, timeout: the communicator's (``comm.timeout`` reads and sets this one).
        impl: its backend (drained, closed or aborted here).
        books: its books (:mod:`collectives._core.books`): the guard of failure notices
            (``books.checker``), the collective numbers and the flight recorder.
        board: its progress board, or None.

    Attributes:
        unusable: None while the communicator may be used; else why not (it was closed or
            aborted, or the error that ended it).
        failed: whether it was declared failed, here or by another rank.
        owner: the thread that may issue calls (:meth:`hand_over`).
        admits: the ident of the thread whose calls go straight on: the owner's while the
            communicator is usable, else None. A call from any other thread takes
            :meth:`admit`, which raises or (the owner's first call, in a thread handed it
            before it started) lets it in: one comparison per call.
    """

    def __init__(
        self,
        mpi_comm: MPI.Comm,
        rank: int,
        size: int,
        timeout: float,
        impl: Backend,
        books: CallBooks,
        board: ProgressBoard | None,
    ):
        self.mpi_comm = mpi_comm
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.impl = impl
        self.books = books
        self.board = board
        self.world_ranks = world_ranks(mpi_comm, size)
        self.unusable: CollectivesError | None = None
        self.failed = False
        # One owner thread: a call from any other thread is refused on every rank alike (a
        # refusal decided by which thread got there first would differ between ranks, and
        # match one thread's call with another's).
        self.owner = threading.current_thread()
        self.admits: int | None = self.owner.ident

    def hand_over(self, thread: threading.Thread) -> None:
        """Make ``thread`` the owner (``Communicator.hand_over``)."""
        if not isinstance(thread, threading.Thread):
            raise InvalidArgumentError(
                f"hand_over: thread must be a threading.Thread, got {type(thread).__name__}"
            )
        self.own("hand_over")
        if self.books.busy:
            raise CommunicatorStateError(f"hand_over: {IN_USE}")
        self.owner = thread
        if self.unusable is None:
            self.admits = thread.ident  # None until it starts: its first call lets it in

    def admit(self, call: str) -> None:
        """A call from a thread that :attr:`admits` does not let straight in: raise
        ``CommunicatorStateError`` where the communicator is closed or dead, or the thread
        does not own it; let in the owner's first call (a thread handed it before it started)."""
        self.ensure_usable(call)
        self.own(call)

    def own(self, call: str) -> None:
        """Raise ``CommunicatorStateError`` unless the calling thread owns the communicator."""
        ident = _get_ident()
        owner = self.owner
        if owner.ident == ident:
            if self.admits is None and self.unusable is None:  # handed over before it started
                self.admits = ident
            return
        raise CommunicatorStateError(
            f"{call}: called from thread {threading.current_thread().name!r}, but the "
            f"communicator belongs to thread {owner.name!r} (the thread that made it, or that "
            "comm.hand_over() gave it to); every rank refuses such a call alike, so that no "
            "rank matches one thread's call with another thread's"
        )

    def _end(self, reason: CollectivesError) -> None:
        """From now on the communicator is unusable for ``reason``: every call is refused."""
        self.unusable = reason
        self.admits = None

    def close(self) -> None:
        """Free the communicator, once the calls in flight have finished (waiting at most the
        timeout for them). Idempotent."""
        if isinstance(self.unusable, _Closed):
            return
        if self.unusable is None:
            self.impl.drain()
        self.impl.close()  # first: a backend that refuses (NCCL inside a group) leaves it open
        self._end(_Closed("communicator is closed"))
        self._free_mpi()

    def abort(self) -> None:
        """Tear the communicator down without waiting for operations in flight."""
        if isinstance(self.unusable, _Closed):
            return
        self._end(_Closed("communicator was aborted"))
        self.impl.abort()
        self._free_mpi()

    def forked(self, parent: int) -> None:
        """In a child forked from process ``parent``: unusable from now on, and closing it
        does nothing; no MPI call is made (MPI is the parent's)."""
        self._end(
            _Closed(
                f"communicator belongs to process {parent}, and this process ({os.getpid()}) "
                "is a child forked from it: MPI cannot be used in a forked child"
            )
        )

    def leaving(self, how: str) -> None:
        """At exit: tell the other ranks that this rank left (``Communicator.leaving``)."""
        guard = self.books.checker
        if self.unusable is not None or guard is None:
            return
        nth = self.books.seq - self.books.p2p
        guard.announce(
            CommunicatorStateError.__name__,
            f"rank {self.rank} (world rank {self.world_ranks[self.rank]}) left the program "
            f"({how}) after collective #{nth} of this communicator: no later collective on it "
            "can complete",
        )

    def stuck_past(self) -> str | None:
        """A rank of this node inside a blocking call for a collective that this rank never
        made (``Communicator.stuck_past``), or None."""
        board = self.board
        if self.unusable is not None or board is None:
            return None
        return board.inside_after(self.books.seq - self.books.p2p)

    def post_waiting(self, pending: Pending) -> Any:
        """Say on the progress board which call this rank waits in; the board, or None."""
        board = self.board
        if board is not None:
            board.waiting(f"{pending.call} ({pending.detail})")
        return board

    def progress_report(self) -> str:
        """Which ranks have not reached this rank's latest call (those on this node)."""
        board = self.board
        return "" if board is None else board.report()

    def fatal(self, error: CollectivesError) -> None:
        """A wait that timed out, or a backend that raises the error that ended it (and keeps
        it as ``failure``): from then on this communicator is dead too. Backends raise; only
        the front end declares the communicator dead."""
        if isinstance(error, CollectiveTimeoutError) or error is self.impl.failure:
            self.die(error)

    def mpi_error(self, call: str, error: MPI.Exception) -> NoReturn:
        """An MPI error raised as a ``CollectivesError`` naming the call and the error; the
        communicator is dead (MPI leaves it in no known state), and the other ranks are told."""
        wrapped = CollectivesError(
            f"{call}: MPI error {error.Get_error_class()} on rank {self.rank}: "
            f"{error.Get_error_string().strip()}; the communicator is unusable"
        )
        wrapped.__cause__ = error
        self.die(wrapped)
        raise wrapped  # die raised already; for the type checker

    def arrive(self, call: str) -> None:
        """Return once all ranks have arrived at ``call``, or declare the communicator dead
        (``Communicator.arrive``)."""
        guard = self.books.checker
        try:  # on the guard's private communicator: no user message can match it
            if guard is None or guard.notice.mpi == MPI.COMM_NULL:  # none in a world of one
                arrive(self.mpi_comm, call, self.timeout)
            else:
                arrive(guard.notice.mpi, call, self.timeout, stamp=guard.notice.id)
        except CollectiveTimeoutError as e:
            self.die(e)

    def check_peers(self, call: str) -> None:
        """If another rank declared the communicator failed, raise the class of its error,
        naming it, the communicator dead (``Communicator.check_peers``)."""
        notice = self.peer_failure()
        if notice is not None:
            self.die(told_error(call, notice), told=notice[1])

    def peer_failure(self) -> tuple[type[CollectivesError], str] | None:
        """The class and text of another rank's failure notice, once one has arrived; None
        while none has (or where there are no notices)."""
        guard = self.books.checker
        return None if guard is None or self.unusable is not None else guard.failure()

    def die(self, error: CollectivesError, told: str | None = None) -> NoReturn:
        """Mark the communicator dead after a timeout, abort the backend, raise ``error``;
        tell the other ranks unless they told this one (``told``: the text of their notice;
        the notice carries the class of ``error``, which they raise). After a timeout on
        several nodes, the error names the ranks that never arrived from every node's board
        (:meth:`_name_the_missing`)."""
        self.declare(error, told)
        raise error

    def declare(self, error: CollectivesError, told: str | None = None) -> None:
        """What :meth:`die` does, without raising (``Communicator.declare_blocked``)."""
        if self.unusable is None:
            self._end(error)
            self.failed = True
            _exit.failed(error, self.timeout)
            guard, board = self.books.checker, self.board
            across = (
                isinstance(error, CollectiveTimeoutError)
                and guard is not None
                and board is not None
                and len(board.members) < self.size
            )
            view = board.view() if across and board is not None else None
            if guard is not None and told is None:
                world = self.world_ranks[self.rank]
                guard.announce(
                    event_name(error),
                    f"rank {self.rank} (world rank {world}) declared it failed: {error}",
                    view,
                )
            elif guard is not None and across:  # passed on, with this node's view
                guard.announce(event_name(error), told, view)
            if across:
                self._name_the_missing(error)
            self.dump_flight_record()
            self.impl.abort()

    def _name_the_missing(self, error: CollectivesError) -> None:
        """Add to ``error`` which ranks never arrived, from the boards of every node: this
        node's, and the views that the other nodes' notices bring (waited for at most
        :data:`VIEWS_WAIT` seconds, as long as this rank's own notice has not left for every
        rank that reached the call, which needs its view); a rank on no board that answered is
        found by elimination (:func:`._safety.progress.across_nodes`)."""
        guard, board = self.books.checker, self.board
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
        return [recorded(entry).as_dict() for entry in self.books.recorder]

    def dump_flight_record(self) -> None:
        """Write the flight record where the user asked (``COLLECTIVES_FLIGHT_RECORDER``)."""
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

    def ensure_usable(self, call: str) -> None:
        """Raise ``CommunicatorStateError`` naming ``call`` if the communicator is closed or
        dead."""
        reason = self.unusable
        if reason is None:
            return
        if isinstance(reason, _Closed):
            raise CommunicatorStateError(f"{call}: {reason} (rank {self.rank})")
        raise CommunicatorStateError(
            f"{call}: communicator is unusable after an earlier error: {reason}"
        )

    def _free_mpi(self) -> None:
        if self.board is not None:
            self.books.forget_board()  # the books hold its words
            self.board.close()
            self.board = None
        # A communicator with calls still in flight is left to MPI_Finalize: freeing it under
        # a pending collective crashes Open MPI when the request is next tested. So is one
        # that failed: another rank may still have calls in flight on it (a rank that raised
        # an argument error before posting its gather leaves its peers' sends pending), and
        # Open MPI's next communicator then met the wrong peers' messages.
        if self.mpi_comm != MPI.COMM_NULL and not self.impl.unfinished and not self.failed:
            self.mpi_comm.Free()
        if self.books.checker is not None:
            self.books.checker.close(failed=self.failed)


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
