"""Check mode: before each call, every rank verifies that all ranks make the same call.

Each rank hashes its call's fields with crc32 (stable across processes, unlike Python's
salted ``hash()``). One small non-blocking all-reduce of ``(hash, -hash)`` with MAX yields
the largest and the smallest hash at once; only when they differ do the ranks exchange
their descriptions, so that every rank raises the same error naming who differs and how.

That all-reduce is the same every time, so where MPI has persistent collectives (MPI 4) it is
made once with ``Allreduce_init`` and only started per call: MPICH then skips building a
schedule, which for 16 bytes costs more than the exchange (2 ranks, one node: 1.9 us per
started request against 4.0 us per ``Iallreduce``).

When every rank of the communicator is on one node, no MPI call is made at all: each rank
writes one 64-bit word, (collective number << 32) | fingerprint, to its slot of the progress
board's shared memory and reads the others' until they carry the same number. One word per
slot needs no ordering between two stores; two slots per rank, used by odd and even
collectives, keep a rank that has moved on from overwriting a word another rank has yet to
read (it cannot pass the next check before this rank has written its word there).
"""

from __future__ import annotations

import ast
import time
import zlib
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .._errors import CollectiveMismatchError, CollectivesError, CollectiveTimeoutError

#: calls between two ranks only: there is nothing to compare across the whole communicator
POINT_TO_POINT = frozenset({"send", "recv", "sendrecv"})
_DESCRIPTION = 512  # bytes of one rank's description of its call, as exchanged
_LEFT: list = []  # private communicators not freed: a comparison may still be in flight


def describe_call(seq: int, call: str, shape: Any, dtype: Any, root: Any, op: Any) -> dict:
    """The fields every rank must agree on for one call (point-to-point calls excluded)."""
    return {
        "seq": seq,
        "call": call,
        "shape": shape,
        "dtype": dtype,
        "root": root,
        "op": None if op is None else str(op),
    }


def mismatch_message(descriptions: list[dict]) -> str:
    """Which fields differ and each rank's value, e.g. ``shape differs: rank 0 (4,), rank 1 (5,)``."""
    keys = [k for k in descriptions[0] if len({repr(d[k]) for d in descriptions}) > 1]
    lines = []
    for key in keys:
        values = ", ".join(f"rank {r}: {d[key]}" for r, d in enumerate(descriptions))
        lines.append(f"{key} differs ({values})")
    first = descriptions[0]
    return (
        f"ranks called different collectives at collective #{first['seq']} of rank 0 "
        f"({first['call']}): " + "; ".join(lines)
    )


def _waiting_info(seq: int, call: str) -> tuple:
    """A check's entry for timeout messages: ``check before barrier, collective #3``."""
    return (seq, f"check before {call}, collective", None, None)


class Checker:
    """The per-communicator state of check mode: a private MPI communicator to compare on.

    ``comm`` is read for its public members (and waited with); ``fail(error)`` is the front
    end's, for a check that timed out; ``requests(request, arrays)`` makes the handle that
    waits for an MPI request under ``comm``'s rules (the front end's
    :class:`collectives._core.work.MpiPending`); ``board``, the communicator's progress board,
    whose shared slots are compared on where the whole communicator is on one node.
    """

    def __init__(
        self,
        comm: Any,
        fail: Callable[[CollectivesError], None],
        requests: Callable[..., Any],
        board: Any = None,
        shared_memory: bool = True,
    ):
        self.comm = comm
        self.fail = fail
        self.requests = requests
        self.mpi = comm.mpi_comm.Dup()
        self.rank = comm.rank
        self.buffer = np.zeros(2, np.int64)
        self._slots = self.buffer.data  # a memoryview: item writes cost less than NumPy's
        self._spec = [self.buffer, MPI.INT64_T]
        self._hashes: dict[tuple, int] = {}
        self._request: MPI.Prequest | None = None
        self._active: MPI.Request | None = None  # the comparison in flight over MPI
        self._posted: tuple | None = None  # what post() compares, for finish()
        self._board: Any = None  # the shared slots, when the whole communicator is on one node
        if shared_memory and board is not None and len(board.members) == comm.size:
            self._board = board.check_slots
            self._mine = board.first_word(board.local_rank)
            others = [i for i in range(len(board.members)) if i != board.local_rank]
            self._others = [board.first_word(i) for i in others]
        elif MPI.Get_version() >= (4, 0) and hasattr(self.mpi, "Allreduce_init"):
            self._request = self.mpi.Allreduce_init(MPI.IN_PLACE, self._spec, MPI.MAX)

    def verify(self, seq: int, call: str, array: Any, name: Any, op: Any, root: Any) -> None:
        """Raise CollectiveMismatchError on every rank unless all ranks make this call.

        ``seq`` numbers collectives only: point-to-point calls are not compared. A check that
        times out makes the communicator dead, as the call itself would have.
        """
        try:
            self._verify(seq, call, array, name, op, root)
        except CollectiveTimeoutError as e:
            self.fail(e)
            raise

    def _verify(self, seq: int, call: str, array: Any, name: Any, op: Any, root: Any) -> None:
        shape, fp = self._fingerprint(seq, call, array, name, op, root)
        if self._board is not None:
            if self._all_posted_the_same(seq, ((seq & 0x7FFFFFFF) << 32) | fp, call):
                return
            self._raise_mismatch(seq, call, shape, name, root, op)
        self._start(fp)
        if not self._finish(seq, call):
            self._raise_mismatch(seq, call, shape, name, root, op)

    def post(self, seq: int, call: str, array: Any, name: Any, op: Any, root: Any) -> None:
        """Start comparing this call over MPI without waiting; :meth:`finish` (on every rank
        at the same later call) waits for the comparison and raises on a mismatch."""
        shape, fp = self._fingerprint(seq, call, array, name, op, root)
        self._posted = (seq, call, shape, name, root, op)
        self._start(fp)

    def finish(self) -> int | None:
        """The number of the call :meth:`post` compared, once compared equal (None: nothing
        was posted); raises ``CollectiveMismatchError`` on every rank otherwise."""
        posted, self._posted = self._posted, None
        if posted is None:
            return None
        seq, call, shape, name, root, op = posted
        try:
            same = self._finish(seq, call)
        except CollectiveTimeoutError as e:
            self.fail(e)
            raise
        if not same:
            self._raise_mismatch(seq, call, shape, name, root, op)
        return seq

    def _fingerprint(
        self, seq: int, call: str, array: Any, name: Any, op: Any, root: Any
    ) -> tuple[Any, int]:
        shape = None if array is None else array.shape
        if call == "scatter" and root == self.rank and shape is not None:
            shape = shape[1:]  # root holds the whole (size, *shape) array
        # Hash the call's fields once per distinct call (a training loop repeats a few), then
        # mix in the sequence number, which changes every time.
        key = (call, shape, name, root, op)
        fixed = self._hashes.get(key)
        if fixed is None:
            code = -1 if op is None else int(op)
            fixed = zlib.crc32(f"{call}|{shape}|{name}|{root}|{code}".encode())
            if len(self._hashes) < 4096:
                self._hashes[key] = fixed
        return shape, fixed ^ ((seq * 0x9E3779B1) & 0xFFFFFFFF)

    def _start(self, fp: int) -> None:
        """Post the all-reduce of ``(fp, -fp)`` with MAX."""
        slots = self._slots
        slots[0] = fp
        slots[1] = -fp
        request = self._request
        if request is not None:
            request.Start()
        else:
            request = self.mpi.Iallreduce(MPI.IN_PLACE, self._spec, MPI.MAX)
        self._active = request

    def _finish(self, seq: int, call: str) -> bool:
        """Wait (under the timeout) for the all-reduce :meth:`_start` posted; whether every
        rank's fingerprint was the same."""
        request, self._active = self._active, None
        assert request is not None
        test = request.Test
        polls = 0
        while not test():
            polls += 1
            if polls == 256:  # a slow rank: wait under the communicator's timeout
                pending = self.requests(request, self._spec)
                pending.info = _waiting_info(seq, call)
                pending.synchronize(self.comm)
                break
        slots = self._slots
        return slots[0] == -slots[1]

    def _all_posted_the_same(self, seq: int, word: int, call: str) -> bool:
        """Post ``word`` on the board; True when every other rank posts the same word."""
        board, parity = self._board, seq & 1
        board[self._mine + parity] = word
        tag = word >> 32
        same = True
        for slot in self._others:
            theirs = board[slot + parity]
            if theirs >> 32 != tag:
                theirs = self._await(slot + parity, tag, seq, call)
            same = same and theirs == word
        return same

    def _await(self, slot: int, tag: int, seq: int, call: str) -> int:
        """Poll one rank's slot until it carries collective ``seq``, under the timeout."""
        board = self._board
        waiting = self.requests(MPI.REQUEST_NULL)  # none: its rules for a poll of the board
        waiting.info = _waiting_info(seq, call)
        polls = 0
        while True:
            theirs = board[slot]
            if theirs >> 32 == tag:
                if waiting.posted is not None:
                    waiting.posted.done_waiting()
                return theirs
            polls += 1
            if polls & 255 == 0:
                waiting._waited(self.comm)

    def _raise_mismatch(
        self, seq: int, call: str, shape: Any, name: Any, root: Any, op: Any
    ) -> None:
        """Every rank found a difference: exchange descriptions and raise the same error."""
        fields = describe_call(seq, call, shape, name, root, op)
        # Non-blocking and under the timeout: a rank that died meanwhile must not hang the others.
        mine = np.frombuffer(repr(fields).encode()[:_DESCRIPTION].ljust(_DESCRIPTION), np.uint8)
        every = np.empty((self.comm.size, _DESCRIPTION), np.uint8)
        request = self.mpi.Iallgather([mine, MPI.BYTE], [every, MPI.BYTE])
        pending = self.requests(request, (mine, every))
        pending.info = (seq, f"exchange of descriptions after a mismatch at {call}", None, None)
        try:
            pending.synchronize(self.comm)
        except CollectiveTimeoutError as e:
            self.fail(e)
            raise
        descriptions = [ast.literal_eval(bytes(row).decode().strip()) for row in every]
        raise CollectiveMismatchError(f"{call}: {mismatch_message(descriptions)}")

    def close(self, failed: bool = False) -> None:
        """Free the private communicator once no comparison is in flight on it: one posted
        (check mode off overlaps them with calls) is first waited for, at most the timeout;
        one that cannot complete (``failed``, or past that) leaves the communicator to
        ``MPI_Finalize``, since Open MPI crashes when a freed one's request progresses."""
        active, self._active = self._active, None
        if active is not None and not failed:
            deadline = time.monotonic() + self.comm.timeout
            while not active.Test() and time.monotonic() < deadline:
                time.sleep(1e-4)
        settled = active is None or (not failed and active.Test())
        if settled and self._request is not None and self._request.Test():
            self._request.Free()
            self._request = None
        if self.mpi == MPI.COMM_NULL:
            return
        if settled:
            self.mpi.Free()
        else:
            _LEFT.append(self.mpi)
        self.mpi = MPI.COMM_NULL
