"""``comm.group()``: the calls of a block held, and waited for at its end.

Inside a group every call is held as the backend's pending (in ``books.held``, where
``Communicator._run`` puts it instead of waiting); the block's end waits for them in order
(every call was posted when made: the order of the waits cannot deadlock). A nested block
joins the outer one.
"""

from __future__ import annotations

from typing import Any

from .._arrays import extents_meet
from .._errors import InvalidArgumentError
from .backend import Backend, BackendContext
from .books import CallBooks
from .lifecycle import Lifecycle


class Groups:
    """The groups of one communicator: what a ``with comm.group():`` block opens and ends.

    ``life`` says whether the communicator may be used and by which thread; ``impl`` is its
    backend, ``books`` its books (whose ``held`` lists the calls of the open group), and
    ``context`` what the held calls are waited with.
    """

    __slots__ = ("_life", "_impl", "_books", "_context", "_sent", "_received")

    def __init__(self, life: Lifecycle, impl: Backend, books: CallBooks, context: BackendContext):
        self._life = life
        self._impl = impl
        self._books = books
        self._context = context
        # the open group's point-to-point buffers: what its sends read, its receives write
        self._sent: list = []
        self._received: list = []

    def open(self) -> bool:
        """Open a group, unless one is open (a nested block joins it): whether this opened it."""
        if self._books.held is not None:
            return False
        self._life.ensure_usable("group")
        self._life.own("group")
        # First: a group_start that raises must leave no group open on this communicator.
        self._impl.group_start()
        self._books.held = []
        self._sent, self._received = [], []
        return True

    def refuse_overlap(self, call: str, sent: Any, received: Any) -> None:
        """Before a point-to-point call of the open group: raise ``InvalidArgumentError``
        naming ``call`` where the memory it receives into (``received``) is memory that a
        send of the group reads, or the memory it sends (``sent``) one that a receive of the
        group writes. MPI leaves such a pair undefined (a receive writing a buffer being
        sent), NCCL alike, and MPICH aborts the job on a message to itself between the same
        memory. Else the call's buffers join the group's."""
        for mine, theirs, what in (
            (received, self._sent, "receives into memory that a send"),
            (sent, self._received, "sends memory that a receive"),
        ):
            if mine is not None and any(extents_meet(mine, other) for other in theirs):
                raise InvalidArgumentError(
                    f"{call}: {what} of the same comm.group() block also uses (a receive "
                    "writing a buffer being sent is undefined); pass distinct buffers"
                )
        if sent is not None:
            self._sent.append(sent)
        if received is not None:
            self._received.append(received)

    def close(self, failed: bool) -> None:
        """End the open group: launch its calls, then (unless the block ``failed``) wait for
        each, under the communicator's rules."""
        books = self._books
        pendings, books.held = books.held or [], None
        self._sent, self._received = [], []
        self._impl.group_end(pendings)
        if not failed:
            for pending in pendings:
                self._context.complete(pending, block=False)


class Group:
    """``comm.group()``: the block's calls are held until it ends (a nested block joins the
    outer one); a class rather than a generator, for the calls of small messages."""

    __slots__ = ("_groups", "_comm", "_outer")

    def __init__(self, groups: Groups, comm: Any):
        self._groups = groups
        self._comm = comm
        self._outer = False

    def __enter__(self) -> Any:
        self._outer = self._groups.open()
        return self._comm

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        if self._outer:
            self._outer = False
            self._groups.close(failed=kind is not None)
