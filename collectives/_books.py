"""The books a communicator keeps on its calls: one object that every call path reads and writes.

Each call, whichever path runs it, does the same in this order:

1. take the thread ``token`` (one thread at a time per communicator; a second one is refused);
2. :meth:`CallBooks.number` it: ``seq`` counts every call; a collective also gets its number
   among collectives, ``seq - p2p``, written to this rank's progress-board ``slots[slot]`` and,
   when due (:mod:`._guard`), verified by ``checker``;
3. append a flight-recorder entry to ``recorder``;
4. post the call and wait for it (past ``yield_after`` of polling, under the timeout);
5. stamp the entry's end and give the token back.

Two paths do it, with this class's methods: the general one (``Communicator._run``, every
call: :meth:`CallBooks.number`, and a backend's ``Pending`` as the entry) and the direct path
(:mod:`._direct`, the calls of NumPy arrays on the MPI backend that need least:
:meth:`CallBooks.begin`, which numbers the call and appends an :class:`Entry`). What a call
records is defined here once; the direct path's MPI calls are posted and polled by stateless
primitives (``_fastmpi.c`` where it built, mpi4py otherwise) that are handed buffers and
handles and read no Python object's memory.

An :class:`Entry` has named fields ``seq, call, shape, dtype, start, end`` (``end`` 0.0 until
it completes): a ``Pending`` is made from it only when someone reads the recorder
(:func:`collectives._work.recorded`), when the call outlasts ``yield_after``, or when it
completes later (made with ``async_op=True``, or inside ``comm.group()``). When posting fails
nothing is in flight and the entry is removed; when polling fails (``MPI_Test`` returns
an error) the call was posted, so its entry stays, never completed, and the MPI error is
raised. Every wait, the direct path's included, is judged by :func:`._deadline.overdue`.

Example:
    >>> books = comm._books
    >>> comm.all_reduce(np.ones(2)); books.seq     # one more call
    1
"""

from __future__ import annotations

import collections
from time import monotonic
from typing import Any, Callable

from ._check import POINT_TO_POINT
from ._errors import CommunicatorStateError


class Entry:
    """One direct-path call in the flight recorder; ``end`` is 0.0 until it completes."""

    __slots__ = ("seq", "call", "shape", "dtype", "start", "end")

    def __init__(self, seq: int, call: str, shape: tuple | None, dtype: str | None):
        self.seq = seq
        self.call = call
        self.shape = shape
        self.dtype = dtype
        self.start = monotonic()
        self.end = 0.0


IN_USE = (
    "the communicator is in use by another thread; issue collectives on one "
    "communicator from one thread at a time"
)


class CallBooks:
    """The per-call state of one communicator (see the module docstring for the order of use).

    Attributes:
        token: ``[None]`` while no call runs; a call pops it and appends it back (``list.pop``
            and ``list.append`` are atomic and cost a third of a Lock's acquire and release).
        seq: calls made so far; ``p2p``: how many of them were point-to-point. Collectives are
            numbered apart (``seq - p2p``) because ranks that pair up for send/recv make
            different numbers of them.
        slots, slot: the progress board's words (64-bit ints) and this rank's index there.
        inside: the board's ``inside`` words (same index): the direct path posts there that
            this rank is inside a blocking MPI call (``nth * 4 + code``), and 0 once it returns.
        checker: the ``Guard`` (:mod:`._guard`), or None; called for a collective when
            ``next_check`` (a collective number) is due, or when more than ``quiet`` seconds
            passed since ``last_call`` (the monotonic time of the last collective).
        recorder: the flight recorder, the last calls (entries or pendings).
        yield_after: seconds of polling before a waiting rank yields its core.
        wait_long: ``wait_long(request, entry, arrays)`` waits for a direct-path call that
            outlasted ``yield_after``, under the timeout (set by the backend).
        pending: ``pending(request, entry, arrays)``: the backend's ``Pending`` of a
            direct-path call, put in its entry's place in the recorder (set by the backend).
        mpi_error: ``mpi_error(call, error)`` raises an MPI error of a direct-path call as the
            front end's ``CollectivesError``, the communicator dead.
        later: ``later(request, entry, arrays, result, async_op)``: a direct-path call made
            with ``async_op=True`` (its ``Work``) or while ``grouped`` (inside
            ``Communicator.group()``, held until the block ends).
        handle, rank, size, blocking: the direct path's MPI communicator (in the form
            ``_direct.handle`` gives), this rank and the size, and whether its synchronous
            ``all_reduce`` and ``broadcast`` are blocking MPI calls.
        owner: ``threading.get_ident()`` of the thread that owns the communicator (0: none
            known yet); the direct path leaves any other thread's call to the general path,
            which refuses it.
    """

    __slots__ = (
        "token",
        "seq",
        "p2p",
        "slots",
        "slot",
        "checker",
        "recorder",
        "yield_after",
        "wait_long",
        "pending",
        "mpi_error",
        "later",
        "grouped",
        "handle",
        "rank",
        "size",
        "blocking",
        "next_check",
        "last_call",
        "quiet",
        "owner",
        "inside",
    )

    def __init__(
        self,
        slots: Any,
        slot: int,
        recorder_length: int,
        yield_after: float,
        wait_long: Callable[[Any, Entry, tuple], None],
        rank: int,
        size: int,
        inside: Any = None,
    ):
        self.token: list = [None]
        self.seq = 0
        self.p2p = 0
        self.slots = slots
        self.slot = slot
        self.checker: Any = None
        self.recorder: collections.deque = collections.deque(maxlen=recorder_length)
        self.yield_after = yield_after
        self.wait_long = wait_long
        self.pending: Any = None
        self.mpi_error: Any = None
        self.later: Any = None
        self.grouped = False
        self.handle: Any = None
        self.rank = rank
        self.size = size
        self.blocking = False
        self.next_check = 1
        self.last_call = monotonic()
        self.quiet = float("inf")
        self.owner = 0
        self.inside: Any = inside

    def take(self, call: str) -> None:
        """Take the token, or raise ``CommunicatorStateError`` naming ``call``."""
        try:
            self.token.pop()
        except IndexError:
            raise CommunicatorStateError(f"{call}: {IN_USE}") from None

    def number(self, call: str, array: Any, name: Any, op: Any, root: Any) -> int:
        """Number one call (and check it in check mode); its ``seq``."""
        self.seq = seq = self.seq + 1
        if call in POINT_TO_POINT:
            self.p2p += 1
        else:
            self.slots[self.slot] = nth = seq - self.p2p
            checker = self.checker
            if checker is not None:
                now, last = monotonic(), self.last_call
                self.last_call = now
                if nth >= self.next_check or now - last > self.quiet:
                    checker.verify(nth, call, array, name, op, root)
        return seq

    def begin(self, call: str, array: Any, name: Any, op: Any, root: Any) -> Entry:
        """Number one direct-path call (:meth:`number`) and append its :class:`Entry`."""
        entry = Entry(
            self.number(call, array, name, op, root),
            call,
            None if array is None else array.shape,
            name,
        )
        self.recorder.append(entry)
        return entry
