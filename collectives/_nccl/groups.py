"""One NCCL group per thread, shared by every NCCL communicator of the process.

NCCL's group depth is per thread (``thread_local int ncclGroupDepth`` in src/group.cc), not
per communicator: once any ``comm.group()`` is open on a thread, a call on *any* NCCL
communicator from that thread is held by NCCL until the outermost group ends. So the
bookkeeping is per thread too: which calls are held, on whose stream they complete, and which
synchronous callers wait at the end.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from .._errors import CollectivesError
from .rules import nccl_error


@dataclass
class Batch:
    """What the outermost ``groupEnd`` launches: per backend, its held calls and the stream
    work that must follow them (AVG's division before NCCL 2.10)."""

    held: dict[Any, list] = field(default_factory=dict)
    after: dict[Any, list[Callable[[], None]]] = field(default_factory=dict)
    waits: list = field(default_factory=list)

    def owners(self) -> list:
        return list(dict.fromkeys([*self.held, *self.after]))


class GroupState:
    """This thread's group: depth (as NCCL counts it) and the batch being collected.

    Example:
        >>> state = GroupState()
        >>> state.enter()
        True
        >>> state.hold("comm b", "pending")
        >>> state.leave().held
        {'comm b': ['pending']}
    """

    def __init__(self) -> None:
        self.depth = 0
        self.batch = Batch()

    @property
    def open(self) -> bool:
        return self.depth > 0

    def enter(self) -> bool:
        """One more ``groupStart``; True when it opens the outermost group."""
        self.depth += 1
        return self.depth == 1

    def hold(self, owner: Any, pending: Any) -> None:
        self.batch.held.setdefault(owner, []).append(pending)

    def then(self, owner: Any, work: Callable[[], None]) -> None:
        self.batch.after.setdefault(owner, []).append(work)

    def wait_at_end(self, pending: Any) -> None:
        self.batch.waits.append(pending)

    def leave(self) -> Batch | None:
        """One ``groupEnd``: the batch when it closes the outermost group, else None."""
        if self.depth == 0:
            raise RuntimeError("groupEnd without groupStart")
        self.depth -= 1
        if self.depth:
            return None
        batch, self.batch = self.batch, Batch()
        return batch


_LOCAL = threading.local()


def current() -> GroupState:
    """The calling thread's group state."""
    state = getattr(_LOCAL, "state", None)
    if state is None:
        state = _LOCAL.state = GroupState()
    return state


def end_group(nccl: Any) -> None:
    """``groupEnd`` for this thread; at the outermost one, complete every communicator's
    held calls, then order the synchronous callers after them."""
    state = current()
    batch = state.leave()
    owners = batch.owners() if batch is not None else []
    for b in owners:
        b._enter(None, strict=False)  # a connect that hangs in groupEnd is timed by each watchdog
    try:
        nccl.groupEnd()
    except Exception as e:
        error = nccl_error("group", e)
        for b in owners:
            b._forget(batch.held.get(b, []) if batch else [], error)
        raise error from e
    finally:
        for b in owners:
            b._leave(released=len(batch.held.get(b, [])) if batch else 0)
    if batch is None:
        return
    for b in owners:
        b._complete_group(batch.held.get(b, []), batch.after.get(b, []))
    failures = []
    for pending in batch.waits:  # every caller is ordered, whichever backend has failed
        try:
            pending.wait(pending.backend.waiter)
        except CollectivesError as e:
            failures.append(e)
    if failures:
        raise failures[0]
