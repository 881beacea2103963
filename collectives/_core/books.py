"""The books a communicator keeps on its calls: the thread token, the numbers, the recorder.

Every call, on every backend, goes through ``Communicator._run``, which does this in order:

1. :meth:`CallBooks.take` the thread token (one call at a time per communicator: a second
   one, from another thread, is refused);
2. :meth:`CallBooks.number` it: ``seq`` counts every call; a collective also gets its number
   among collectives, ``seq - p2p``, written to this rank's word on the progress board and,
   when due (:mod:`collectives._safety.guard`), verified by ``checker``;
3. issue it on the backend, which gives a ``Pending``, and append that to ``recorder``;
4. wait for it (unless ``async_op=True``, or inside a group: then it is held in ``held``),
   under the timeout;
5. :meth:`CallBooks.give` the token back.

Example:
    >>> books = CallBooks(None, 0, None, 64)
    >>> books.take("all_reduce")
    >>> books.number("all_reduce", None, "float32", None, None)
    1
    >>> books.give()
"""

from __future__ import annotations

from collections import deque
from time import monotonic
from typing import Any

from .._errors import CommunicatorStateError
from .._safety.check import POINT_TO_POINT

IN_USE = (
    "the communicator is in use by another thread; issue collectives on one "
    "communicator from one thread at a time"
)


class CallBooks:
    """The per-call state of one communicator.

    Args:
        slots: the progress board's words (int64, a memoryview), or None: no board.
        slot: this rank's collective-number word there (see
            :mod:`collectives._safety.progress`).
        inside: the board's words from this rank's ``inside`` word on, indexed by ``slot``
            as ``slots`` is, or None.
        recorder_length: how many calls the flight recorder keeps.

    Attributes:
        busy: whether a call holds the communicator (the thread token).
        seq: calls made so far; ``p2p``: how many of them were point-to-point. Collectives
            are numbered apart (``seq - p2p``) because ranks that pair up for send/recv make
            different numbers of them.
        current: ``(seq, call, shape, dtype, start)`` of the call being numbered or issued
            last (``start``: its monotonic time).
        checker: the ``Guard`` (:mod:`collectives._safety.guard`), or None; called for a collective when
            ``next_check`` (a collective number) is due, or when more than ``quiet`` seconds
            passed since ``last_call`` (the monotonic time of the last collective).
        recorder: the flight recorder, the last calls' pendings.
        held: the pendings of the calls that an open ``comm.group()`` holds until its end
            (:mod:`collectives._core.grouping`), or None outside a group.
        owner: ``threading.get_ident()`` of the thread that owns the communicator (0: none
            known yet).
    """

    __slots__ = (
        "busy",
        "seq",
        "p2p",
        "current",
        "checker",
        "next_check",
        "last_call",
        "quiet",
        "recorder",
        "held",
        "owner",
        "_slots",
        "_inside",
        "_slot",
    )

    def __init__(self, slots: Any, slot: int, inside: Any, recorder_length: int):
        self.busy = False
        self.seq = 0
        self.p2p = 0
        self.current: tuple = (0, "operation", None, None, 0.0)
        self.checker: Any = None
        self.next_check = 1
        self.last_call = monotonic()
        self.quiet = float("inf")
        self.recorder: deque = deque((), recorder_length)
        self.held: list | None = None
        self.owner = 0
        self._slots = slots
        self._inside = inside
        self._slot = slot

    def take(self, call: str) -> None:
        """Take the thread token, or raise ``CommunicatorStateError`` naming ``call``."""
        if self.busy:
            raise CommunicatorStateError(f"{call}: {IN_USE}")
        self.busy = True

    def give(self) -> None:
        """Give the thread token back."""
        self.busy = False

    def number(self, call: str, array: Any, name: Any, op: Any, root: Any) -> int:
        """Number one call (check mode may verify it across ranks first); its ``seq``."""
        self.seq = seq = self.seq + 1
        now = monotonic()
        self.current = (seq, call, None if array is None else array.shape, name, now)
        if call in POINT_TO_POINT:
            self.p2p += 1
            return seq
        nth = seq - self.p2p
        if self._slots is not None:
            self._slots[self._slot] = nth
        checker = self.checker
        if checker is not None:
            last, self.last_call = self.last_call, now
            if nth >= self.next_check or now - last > self.quiet:
                checker.verify(nth, call, array, name, op, root)
        return seq

    def inside(self, code: int) -> None:
        """Post on the board that this rank is inside the blocking call ``code`` (the
        progress board's ``BLOCKING_CALLS``) of its current collective; 0: it has returned."""
        if self._inside is not None:
            self._inside[self._slot] = 0 if code == 0 else (self.seq - self.p2p) * 16 + code

    def forget_board(self) -> None:
        """Let go of the progress board's words (before the board is closed)."""
        self._slots = self._inside = None


__all__ = ["IN_USE", "CallBooks"]
