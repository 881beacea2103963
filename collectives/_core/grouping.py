"""``comm.group()`` and the waits of held calls (a base of ``Communicator``).

Inside a group every call is held as the backend's pending; the block's end waits for them
in order (every call was posted when made: the order of the waits cannot deadlock). A nested
block joins the outer one.
"""

from __future__ import annotations

from typing import Any

from .backend import BackendContext
from .lifecycle import Lifecycle
from .work import Pending


class Grouping(Lifecycle):
    """Groups and waits: what ``Communicator.group()``, a ``Work`` and a group's end call."""

    _group: list | None
    _context: BackendContext

    def group(self) -> _Group:
        """Batch the calls inside into one launch; they complete when the block ends.

        Example (a ring exchange that cannot deadlock):
            >>> with comm.group():
            ...     comm.send(x, (comm.rank + 1) % comm.size)
            ...     y = comm.recv(np.empty_like(x), (comm.rank - 1) % comm.size)
            >>> y                  # the previous rank's x (at one rank: its own)
            array([0., 1., 2., 3.], dtype=float32)
        """
        return _Group(self)

    def _open_group(self) -> None:
        self.ensure_usable("group")
        self._own("group")
        # First: a group_start that raises must leave no group open on this communicator.
        self._impl.group_start()
        self._group = []

    def _close_group(self, failed: bool) -> None:
        pendings, self._group = self._group or [], None
        self._impl.group_end(pendings)
        if not failed:
            for pending in pendings:
                self._wait(pending)

    # What a Work's wait() and synchronize() call (and a group's end): the backend context's
    # one wait that may fail.
    def _wait(self, pending: Pending) -> None:
        self._context.complete(pending, block=False)

    def _synchronize(self, pending: Pending) -> None:
        self._context.complete(pending)


class _Group:
    """``comm.group()``: the block's calls are held until it ends (a nested block joins the
    outer one); a class rather than a generator, for the calls of small messages."""

    __slots__ = ("_comm", "_outer")

    def __init__(self, comm: Grouping):
        self._comm = comm
        self._outer = False

    def __enter__(self) -> Any:
        comm = self._comm
        if comm._group is None:
            comm._open_group()
            self._outer = True
        return comm

    def __exit__(self, kind: Any, error: Any, traceback: Any) -> None:
        if self._outer:
            self._outer = False
            self._comm._close_group(failed=kind is not None)
