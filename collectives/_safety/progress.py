"""The progress board: each rank's latest collective's number, and the call it waits in, in
memory shared within a node.

A rank that times out reads the board to say which ranks never reached its call, and what
each rank of the node is waiting in (so a rank that skipped a collective and waits in the next
one is named by what it does, not only by its number). A board shows one node; across nodes
the ranks that time out or are told of a timeout exchange their boards' views
(:mod:`collectives._safety.guard`), which :func:`across_nodes` puts together. The board is
a file in /dev/shm that every rank of the node maps and that is unlinked as soon as all have
opened it, so nothing is left behind even if the job is killed, and closing needs no
collective (which a communicator that timed out could not complete).
"""

from __future__ import annotations

import mmap
import os
import tempfile
from typing import Any

from mpi4py import MPI

#: per rank, each a word: its collective number, check mode's two slots, its blocking call
NUMBER, CHECK, INSIDE = 0, 1, 3
#: the calls a rank posts it is inside, by code (``inside`` words: ``nth * 16 + code``): the
#: collectives, which may be blocking MPI calls (sends and recvs never block)
BLOCKING_CALLS = {
    1: "all_reduce",
    2: "broadcast",
    3: "reduce",
    4: "all_gather",
    5: "reduce_scatter",
    6: "all_to_all",
    7: "gather",
    8: "scatter",
    11: "barrier",
}
_TEXT = 120  # per rank: the call it waits in, "all_reduce (shape (3,), float64)", UTF-8
_AREA = 8 + _TEXT  # the collective number that text belongs to, then the text
#: bytes of one rank's part of the board: its words, then its area. Every rank writes its own
#: words on every call; parts of two ranks that shared a cache line (or the pair of lines that
#: CPUs fetch together) cost 0.1 to 0.2 us a call in line transfers between the cores (Open
#: MPI, 2 ranks, 8 B all_reduce in place: 0.88 to 0.99 us against 0.77 to 0.80 apart; raw
#: mpi4py 0.71 to 0.81; benchmarks/results/cpu-2core-2026-11-27-board-kept/)
_WORDS_BYTES = 128  # a rank's words, padded to the pair of cache lines
_PART = _WORDS_BYTES + _AREA
_STRIDE = _PART // 8  # words from one rank's part to the next's


def cpus() -> frozenset[int]:
    """The CPUs this process may run on."""
    try:
        return frozenset(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return frozenset(range(os.cpu_count() or 1))


def shares_a_core(mine: frozenset[int], node: list[frozenset[int]]) -> bool:
    """Whether a rank that may run on CPUs ``mine`` shares a core with another rank of its
    node (``node``: each local rank's CPUs, its own included): the node's ranks outnumber the
    CPUs they may run on together, or another rank is pinned to the one CPU this one is.
    A rank pinned to a CPU of its own (Intel MPI's default) shares none.

    Example:
        >>> shares_a_core(frozenset({0}), [frozenset({0}), frozenset({1})])
        False
    """
    if len(node) > len(frozenset().union(*node)):
        return True
    return len(mine) == 1 and node.count(mine) > 1


def across_nodes(views: dict[int, int], size: int) -> str:
    """Which of ``size`` ranks have not reached the furthest collective, from the ``views``
    (rank: collective number) of the boards of every node that answered. A rank on no board
    that answered (alone on its node, or all of its node's ranks silent) cannot be seen: where
    every rank seen has reached that collective, one rank unseen is named by elimination, and
    of several unseen, one or more never arrived.

    Example:
        >>> across_nodes({0: 2, 1: 2, 2: 2, 3: 1}, 4)
        'From the boards of every node: ranks that have not reached collective #2: rank 3 (at collective #1).'
        >>> across_nodes({0: 2, 1: 2, 3: 2, 4: 2}, 5)
        'From the boards of the nodes that answered: ranks that have not reached collective #2: rank 2 (on no board that answered: by elimination, as every rank seen has reached it).'
        >>> across_nodes({0: 2, 1: 2}, 4)
        'From the boards of the nodes that answered: every rank seen has reached collective #2; of ranks 2, 3, on no board that answered, one or more never did.'
    """
    furthest = max(views.values(), default=0)
    behind = [f"rank {r} (at collective #{n})" for r, n in sorted(views.items()) if n < furthest]
    unseen = [r for r in range(size) if r not in views]
    whose = "the nodes that answered" if unseen else "every node"
    if len(unseen) == 1 and not behind:
        why = "on no board that answered: by elimination, as every rank seen has reached it"
        behind = [f"rank {unseen[0]} ({why})"]
    elif unseen and not behind:
        listed = ", ".join(map(str, unseen))
        return (
            f"From the boards of {whose}: every rank seen has reached collective #{furthest}; "
            f"of ranks {listed}, on no board that answered, one or more never did."
        )
    elif unseen:
        behind.append("and, on no board that answered, " + ", ".join(f"rank {r}" for r in unseen))
    if not behind:
        return f"From the boards of {whose}: every rank has reached collective #{furthest}."
    listed = ", ".join(behind)
    return (
        f"From the boards of {whose}: ranks that have not reached collective #{furthest}: {listed}."
    )


class ProgressBoard:
    """``slots[local_rank]`` holds each rank's latest collective's number (the communicator
    writes its own on every collective); ``report()`` says which ranks are behind this one.

    ``check_slots`` (two per local rank) are check mode's: see ``_check``. ``waiting()``
    and ``done_waiting()`` post the call this rank is blocked in, which ``report()`` shows.
    ``inside[local_rank]`` is ``nth * 16 + code`` while this rank is inside a blocking MPI
    call (:data:`BLOCKING_CALLS`) for collective ``nth``, else 0: the MPI backend writes it
    around the call, as a blocking call cannot post anything once it has begun.
    """

    def __init__(self, mpi_comm: MPI.Comm):
        local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            self.local_rank = local.Get_rank()
            # Each local rank's communicator rank, to name ranks as the user knows them, and
            # the CPUs it may run on.
            node = local.allgather((mpi_comm.Get_rank(), cpus()))
            self.members: list[int] = [rank for rank, _ in node]
            #: whether this rank shares a core with another of the node's (see shares_a_core)
            self.shares_a_core = shares_a_core(node[self.local_rank][1], [c for _, c in node])
            self.size = mpi_comm.Get_size()
            path = None
            if self.local_rank == 0:
                folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
                fd, path = tempfile.mkstemp(prefix="collectives-progress-", dir=folder)
                os.ftruncate(fd, _PART * len(self.members))
                os.close(fd)
            path = local.bcast(path, root=0)
            with open(path, "r+b") as f:
                self._map = mmap.mmap(f.fileno(), _PART * len(self.members))
            local.Barrier()
            if self.local_rank == 0:
                os.unlink(path)
        finally:
            local.Free()
        self._view = memoryview(self._map)
        #: the board as int64 words; local rank i's start at ``first_word(i)``
        self.words: Any = self._view.cast("q")
        self.slots: Any = self.words[NUMBER::_STRIDE]
        self.inside: Any = self.words[INSIDE::_STRIDE]
        #: check mode's words: local rank i's two at ``first_word(i)`` and the one after
        self.check_slots: Any = self.words[CHECK:]

    @staticmethod
    def first_word(index: int) -> int:
        """Where local rank ``index``'s words begin in :attr:`words` (and in a view of it that
        begins at one of their offsets, :data:`INSIDE` or :data:`CHECK`)."""
        return index * _STRIDE

    @staticmethod
    def _area(index: int) -> int:
        """Where local rank ``index``'s area begins, in bytes."""
        return index * _PART + _WORDS_BYTES

    def view(self) -> dict[int, int]:
        """Each rank of this node: its latest collective's number."""
        return {r: int(self.slots[i]) for i, r in enumerate(self.members)}

    def waiting(self, text: str) -> None:
        """Post that this rank is blocked in the call ``text`` describes (only once a wait
        lasts: no cost on calls that complete at once)."""
        if self.slots is None:
            return
        data = text.encode()[:_TEXT].ljust(_TEXT, b"\0")
        start = self._area(self.local_rank)
        self._map[start + 8 : start + _AREA] = data
        number = self.slots[self.local_rank] + 1  # 0 means "waits in nothing"
        self._map[start : start + 8] = number.to_bytes(8, "little", signed=True)

    def done_waiting(self) -> None:
        if self.slots is None:
            return
        start = self._area(self.local_rank)
        self._map[start : start + 8] = bytes(8)

    def _waits_in(self, index: int) -> str | None:
        """What local rank ``index`` posted it waits in, if that is its current collective."""
        start = self._area(index)
        number = int.from_bytes(self._map[start : start + 8], "little", signed=True)
        if number == 0 or number - 1 != self.slots[index]:
            return None
        return self._map[start + 8 : start + _AREA].rstrip(b"\0").decode(errors="replace")

    def _inside(self, index: int) -> str | None:
        """The blocking call local rank ``index`` is inside, if it is its current collective."""
        word = self.inside[index]
        if word == 0 or word >> 4 != self.slots[index]:
            return None
        return BLOCKING_CALLS.get(word & 15)

    def inside_after(self, nth: int) -> str | None:
        """A rank of the node inside a blocking call for a collective after ``nth``, as
        ``"rank 0 is inside a blocking all_reduce at collective #2"``, or None."""
        for i, r in enumerate(self.members):
            call = self._inside(i)
            if call is not None and self.slots[i] > nth:
                return f"rank {r} is inside a blocking {call} at collective #{self.slots[i]}"
        return None

    def report(self) -> str:
        slots = self.slots
        mine = slots[self.local_rank]
        behind = [(r, slots[i]) for i, r in enumerate(self.members) if slots[i] < mine]
        elsewhere = sorted(set(range(self.size)) - set(self.members))
        parts = []
        if behind:
            listed = ", ".join(f"rank {r} (at collective #{s})" for r, s in behind)
            parts.append(f"Ranks that have not reached collective #{mine}: {listed}.")
        else:
            parts.append(f"Every rank on this node has reached collective #{mine}.")
        # A rank that issued the call (an async one, DDP's buckets) and then stopped waiting:
        # with non-blocking MPI calls nothing progresses on a rank that does not wait or call.
        idle = [
            r
            for i, r in enumerate(self.members)
            if i != self.local_rank
            and slots[i] >= mine
            and self._waits_in(i) is None
            and self._inside(i) is None
        ]
        if idle:
            listed = ", ".join(f"rank {r}" for r in idle)
            parts.append(
                f"Ranks that have issued collective #{mine} but wait in no call (stopped, or "
                f"busy outside the library): {listed}."
            )
        doing = []
        for i, r in enumerate(self.members):
            call, blocking = self._waits_in(i), self._inside(i)
            this = " (this one)" if i == self.local_rank else ""
            if blocking:
                what = f"is inside a blocking {blocking}"
            else:
                what = f"waits in {call}" if call else "waits in no call"
            doing.append(f"rank {r}{this} {what} at collective #{slots[i]}")
        if len(doing) > 1:
            parts.append("What each rank of the node is doing: " + "; ".join(doing) + ".")
        if not behind and not idle and not elsewhere and len(doing) > 1:
            # every rank is in the call: they may disagree on it
            parts.append(
                "If the ranks called it with different arguments (shape, dtype, root, op), it "
                "may never complete: check mode (COLLECTIVES_CHECK=1) names the difference."
            )
        if elsewhere:
            parts.append(f"Ranks on other nodes, not visible from here: {elsewhere}.")
        return " ".join(parts)

    def close(self) -> None:
        if self.slots is not None:
            for view in (self.slots, self.check_slots, self.inside, self.words, self._view):
                view.release()
            self.slots = self.check_slots = self.inside = None
            self._map.close()
