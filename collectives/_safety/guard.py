"""What every communicator verifies on a schedule: that no rank declared it failed, and (check
mode off) that the ranks still make the same calls.

Two guarantees ride on :meth:`CallBooks.number`, which calls :meth:`Guard.verify` for a
collective only when ``books.next_check`` is due or the communicator was quiet on this rank for
more than half its timeout (nothing is done on the other calls, so that they cost nothing):

- **All or nothing.** A rank that declares a communicator failed (a timeout, an MPI or NCCL
  error) sends a short notice over MPI to every other rank (on a private duplicate
  communicator, so across nodes too), which each rank looks for with ``MPI_Improbe`` at its
  next verified call, in every wait that lasts (:meth:`Pending._waited`) and, in a blocking
  MPI call, from the watchdog's thread (:mod:`collectives._mpi.watchdog`), and then raises
  the class of the first failure (the notice carries it: a timeout is a
  ``CollectiveTimeoutError`` on every rank, :mod:`._errors`), naming that failure and its
  rank. A notice also carries its sender's view of its node's progress board (each rank's
  collective number); after a timeout every rank told passes the notice on with its own
  node's view, so that every rank can say which ranks never arrived, whichever node they
  are on (:func:`._safety.progress.across_nodes`). A rank that arrives late at a call the
  others failed comes to it after more than the timeout without a call on this communicator
  (the others waited that long for it), so its call is verified, and refused before it is
  posted: it never completes a call that the others failed.
- **Mismatches caught by default.** With check mode off, collectives #1 to #8 and then #16,
  #32, ..., #1024 and every 1024th after are compared across ranks (the same numbers on every
  rank). The comparison overlaps the call: its all-reduce of fingerprints (check mode's, over
  MPI on a private communicator) is posted before the call and read at the next collective,
  so a rank that never comes makes the call itself time out, as it would unchecked. A
  mismatch raises ``CollectiveMismatchError`` on every rank at that next collective (which
  no rank then makes), naming the calls whose results may be wrong: those since the last
  comparison that passed. In check mode every call is compared before it is made.

Example:
    >>> [n for n in range(1, 5000) if scheduled(n)][:12]
    [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64, 128]
"""

from __future__ import annotations

import secrets
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .._errors import CollectiveMismatchError, CollectivesError, event_class
from .check import Checker

EVERY_CALL_UNTIL = 8  # the first collectives, where a program's mistakes show first
PERIOD = 1024  # then powers of two up to this, then every PERIOD-th
# the class, the sender's view and the text: under the eager limit of Open MPI's shared
# memory, 4 KiB (`ompi_info --param btl sm --level 9`), so that no send waits for a receive
_NOTICE_BYTES = 2048
_TAG = 7
_LEFT: list[MPI.Comm] = []  # notice communicators not freed: a message may still come


def next_check(nth: int) -> int:
    """The collective number verified next after collective ``nth`` (check mode off).

    Example:
        >>> next_check(3), next_check(8), next_check(100), next_check(5000)
        (4, 16, 128, 5120)
    """
    if nth < EVERY_CALL_UNTIL:
        return nth + 1
    if nth < PERIOD:
        return 1 << nth.bit_length()
    return (nth // PERIOD + 1) * PERIOD


def scheduled(nth: int) -> bool:
    """Whether collective ``nth`` is compared across ranks with check mode off.

    Example:
        >>> [n for n in range(1, 3000) if scheduled(n)][8:]
        [16, 32, 64, 128, 256, 512, 1024, 2048]
    """
    return nth <= EVERY_CALL_UNTIL or (nth & (nth - 1) == 0) or nth % PERIOD == 0


class FailureNotice:
    """The first "I declared it failed" of any other rank, looked for with ``MPI_Improbe``:
    the communicator's id, the name of the error's class (:func:`._errors.event_name`), a
    colon, the sender's view (``rank=number`` for each rank of its node, comma-separated), a
    colon, and the text. ``views`` gathers the views of every notice that arrived.

    No receive stays posted: a standing receive from any source makes MPICH poll every
    network on each progress call, which slowed every 8-byte all_reduce by about a tenth.
    """

    def __init__(self, mpi_comm: MPI.Comm):
        self.size = mpi_comm.Get_size()
        self.rank = mpi_comm.Get_rank()
        self.mpi = mpi_comm.Dup() if self.size > 1 else MPI.COMM_NULL
        # MPI reuses a freed communicator's context: a notice sent to a communicator that was
        # closed since could reach a new one. Each carries the id rank 0 drew for this one.
        self.id = 0
        if self.size > 1:
            drawn = np.array([secrets.randbits(63)], np.int64)
            self.mpi.Bcast(drawn, root=0)
            self.id = int(drawn[0])
        self.sent: list[MPI.Request] = []
        self._peers: list[int] = []  # whom each of ``sent`` goes to
        self.received: tuple[type[CollectivesError], str] | None = None
        #: each rank's collective number, as the boards of the notices' senders showed it
        self.views: dict[int, int] = {}
        self._data = bytearray()

    def announce(self, kind: str, text: str, view: dict[int, int] | None = None) -> None:
        """Tell every other rank that the communicator failed with an error of class ``kind``
        (a name of :mod:`._errors`), saying ``text``, with ``view`` (rank: collective number,
        for the ranks of this node); no wait: a small message, sent eagerly. Once only."""
        if self.size == 1 or self.sent or self.mpi == MPI.COMM_NULL:
            return
        seen = ",".join(f"{rank}={nth}" for rank, nth in sorted((view or {}).items()))
        body = f"{kind}:{seen}:{text}".encode()
        data = self.id.to_bytes(8, "little") + body[: _NOTICE_BYTES - 8]
        self._data = bytearray(data.ljust(_NOTICE_BYTES, b"\0"))
        self._peers = [peer for peer in range(self.size) if peer != self.rank]
        self.sent = [self.mpi.Isend([self._data, MPI.BYTE], peer, _TAG) for peer in self._peers]

    def delivered(self, ranks: set[int]) -> bool:
        """Whether this rank's notice has left for each of ``ranks`` (a send may need this
        rank's progress to go: Open MPI's over TCP, to a rank not yet connected to)."""
        return all(r.Test() for r, peer in zip(self.sent, self._peers) if peer in ranks)

    def failure(self) -> tuple[type[CollectivesError], str] | None:
        """The class and text of the first notice another rank sent, once it has arrived;
        else None. Every notice that arrived is received, its view added to ``views``."""
        # Twice: Intel MPI's first probe may only progress an arrived notice in (measured).
        for _ in range(2):
            if self.mpi == MPI.COMM_NULL:
                break
            # A matched probe: the watchdog of blocking calls may look from its own thread.
            while (message := self.mpi.Improbe(MPI.ANY_SOURCE, _TAG)) is not None:
                buffer = bytearray(_NOTICE_BYTES)
                message.Recv([buffer, MPI.BYTE])
                if int.from_bytes(buffer[:8], "little") == self.id:  # else for a closed one
                    body = buffer[8:].rstrip(b"\0").decode(errors="replace")
                    kind, _, rest = body.partition(":")
                    seen, _, text = rest.partition(":")
                    for pair in filter(None, seen.split(",")):
                        rank, _, nth = pair.partition("=")
                        self.views[int(rank)] = max(int(nth), self.views.get(int(rank), 0))
                    if self.received is None:
                        self.received = (event_class(kind), text)
            if self.received is not None:
                break
        return self.received

    def close(self, failed: bool) -> None:
        """Free the communicator, unless a message may still come for it (``failed``, or a
        notice came or went): Open MPI crashes on a message that finds its communicator
        freed, so that one is left to ``MPI_Finalize``."""
        arrived = self.failure()
        leave = failed or arrived is not None or bool(self.sent)
        # A notice not yet delivered stays with MPI (freed requests complete on their own).
        for request in self.sent:
            if not request.Test():
                request.Free()
        self.sent = []
        if self.mpi == MPI.COMM_NULL:
            return
        if leave:
            _LEFT.append(self.mpi)
        else:
            status = MPI.Status()
            while self.mpi.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG, status):  # an arrival's knock
                scratch = bytearray(max(status.Get_count(MPI.BYTE), 1))
                self.mpi.Recv([scratch, MPI.BYTE], status.Get_source(), status.Get_tag())
            self.mpi.Free()
        self.mpi = MPI.COMM_NULL


class Guard:
    """``books.checker``: the notice check on every verified call, and the cross-rank check of
    the call itself: every call in check mode, on the schedule of :func:`next_check` otherwise.

    ``comm`` is read for its public members; ``books`` are its books; ``check_peers(call)``
    raises once another rank declared it failed, and ``fail(error)`` ends it after a check
    that timed out (the front end's); ``requests`` makes the handles that check mode waits
    for its MPI requests with (:class:`Checker`); ``board`` is its progress board.
    """

    def __init__(
        self,
        comm: Any,
        every_call: bool,
        books: Any,
        check_peers: Callable[[str], None],
        fail: Callable[[CollectivesError], None],
        requests: Callable[..., Any],
        board: Any = None,
    ):
        self.comm = comm
        self.books = books
        self.check_peers = check_peers
        self.fail = fail
        self.every_call = every_call
        self.notice = FailureNotice(comm.mpi_comm)
        self.checker: Checker | None = None
        if comm.size > 1 or every_call:
            # Off check mode, comparisons overlap their calls: over MPI, which keeps them in
            # order (the node's shared slots could be overwritten by a rank that ran ahead).
            self.checker = Checker(comm, fail, requests, board, shared_memory=every_call)
        self.verified = 0  # the last collective compared across ranks

    def verify(self, nth: int, call: str, array: Any, name: Any, op: Any, root: Any) -> None:
        """Called by ``CallBooks.number`` (see the module docstring for when)."""
        self.check_peers(call)
        books = self.books
        checker = self.checker
        if nth < books.next_check or checker is None:
            return  # verified for the quiet gap only: the schedule is the same on every rank
        if self.every_call:
            books.next_check = nth + 1
            checker.verify(nth, call, array, name, op, root)
            return
        try:
            compared = checker.finish()
        except CollectiveMismatchError as e:
            books.next_check = next_check(nth)
            e.args = (self._since(e, nth),)
            raise
        if compared is not None:
            self.verified = compared
        if scheduled(nth):
            checker.post(nth, call, array, name, op, root)
            books.next_check = nth + 1  # where this comparison is finished
        else:
            books.next_check = next_check(nth)

    def _since(self, error: CollectiveMismatchError, nth: int) -> str:
        since = self.verified + 1
        return (
            f"{error}. Found when collective #{nth} was called, which is not made on any rank; "
            f"the results of collectives #{since} and later may be wrong (with check mode off "
            f"collectives #1 to #{EVERY_CALL_UNTIL}, then #16, #32, ... and every {PERIOD}th "
            "are compared, as they are made; COLLECTIVES_CHECK=1 compares every call before "
            "it is made)"
        )

    def failure(self) -> tuple[type[CollectivesError], str] | None:
        return self.notice.failure()

    def announce(self, kind: str, text: str, view: dict[int, int] | None = None) -> None:
        self.notice.announce(kind, text, view)

    def close(self, failed: bool = False) -> None:
        self.notice.close(failed)
        if self.checker is not None:
            self.checker.close(failed)
