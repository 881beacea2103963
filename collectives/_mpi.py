"""The MPI backend: mpi4py's non-blocking buffer calls on NumPy arrays (never pickling).

Every verb takes the arguments it needs (:class:`~._backend.Backend` lists them; the front
end has checked them) and returns a :class:`MpiPending`. CuPy arrays are staged through
host memory unless the MPI library is CUDA-aware (:meth:`MpiBackend.run`). The
backend also sets up the direct path (:mod:`._direct`) on the front end's books, and waits
for its calls that last (:meth:`MpiBackend.direct_path`). The tables and the pending it
stands on are in :mod:`._mpi_base`.
"""

from __future__ import annotations

import atexit
import sys
import weakref
from typing import Any, Callable, cast

import numpy as np
from mpi4py import MPI

from . import _callbooks, _direct, _fork, _mpi_parts
from ._arrays import array_module, is_device_array, is_slot
from ._backend import BackendContext, Verb
from ._books import CallBooks, Entry
from ._errors import CollectivesError, CollectiveTimeoutError
from ._mpi_base import (  # noqa: F401  (the backend's names, imported from here)
    _ABANDONED,
    _TAG,
    EXCHANGE_TAG,
    FAST_OP_OBJECTS,
    FAST_TYPE_OBJECTS,
    KEPT_ALL_TO_ALL_IN_PLACE,
    MPI_OP,
    MPI_TYPE,
    SLOWER_NON_BLOCKING,
    UPCAST,
    MpiPending,
    abandon,
    blocking_by_default,
    kept_bytes,
    library_path,
    mpi_cuda_aware,
)
from ._numerics import bfloat16_to_float32, divide_in_place, float32_to_bfloat16
from ._ops import ReduceOp
from ._watchdog import WATCHDOG
from ._work import Pending

#: calls in flight on one communicator before those done are looked for (the books' Works
#: are looked for at the same count)
_REAP_AT = _callbooks.REAP_AT
_HOST = frozenset({np.ndarray, type(None)})  # array types that are never staged


def _decode(x: Any, name: str) -> Any:
    return bfloat16_to_float32(x) if name == "bfloat16" else x.astype(np.float32)


def _encode(values: Any, out: Any, name: str) -> None:
    if name == "bfloat16":
        float32_to_bfloat16(values, out)
    else:
        out[...] = values


def _copy(out: Any, result: Any) -> None:
    out[...] = result


def _chain(first: Callable[[], None] | None, then: Callable[[], None]) -> Callable[[], None]:
    if first is None:
        return then

    def both() -> None:
        first()
        then()

    return both


#: elements one MPI call is given: counts are C ints where MPI has no large-count calls
#: (Open MPI 5), so larger calls are made in parts (``MpiBackend._in_parts``, and for the
#: verbs that are not element-wise, :mod:`._mpi_parts`)
MAX_COUNT = 2**31 - 1


def _in_float32(name: str, op: ReduceOp | None) -> bool:
    """Whether a reduction of dtype ``name`` runs on float32 copies: those this MPI cannot
    reduce (UPCAST), and float16's AVG on every MPI, whose sum would overflow (past 65504)
    where the mean does not, as NCCL's avg (which divides before summing) never does."""
    return name in UPCAST or (op is ReduceOp.AVG and name == "float16")


class _AllOf:
    """The request of a call made in parts: complete once every part is."""

    def __init__(self, parts: list[MpiPending]):
        self.parts = parts

    def Test(self) -> bool:  # noqa: N802 - as MPI.Request's
        return all([part.test() for part in self.parts])


class MpiBackend:
    """Collectives over one mpi4py communicator."""

    name = "mpi"

    def __init__(
        self, mpi_comm: MPI.Comm, cuda_aware: bool | None = None, blocking: bool | None = None
    ):
        ready()
        self.comm = mpi_comm
        self.size = mpi_comm.Get_size()
        self.rank = mpi_comm.Get_rank()
        self.cuda_aware = mpi_cuda_aware() if cuda_aware is None else cuda_aware
        #: synchronous direct-path calls as blocking MPI calls (see ``init(mpi_blocking=)``)
        self.blocking = blocking_by_default() if blocking is None else blocking
        #: bytes a rank up to which synchronous calls are kept persistent requests
        self.kept_bytes = kept_bytes(blocking)
        self._blocking_told = blocking
        self.in_flight: set[MpiPending] = set()
        self._reap_at = _REAP_AT
        #: calls were left in flight at a close or abort: the MPI communicator is not freed
        self.unfinished = False
        self._context: BackendContext | None = None
        #: the books whose direct path runs on this communicator (``direct_path``), or None
        self._books: CallBooks | None = None

    #: an MPI backend fails through the front end only (a timeout, an MPI error)
    failure: CollectivesError | None = None
    #: MPI takes any array it is given (device arrays are staged)
    checks_arrays = False
    #: NumPy arrays (CuPy ones are staged through the host)
    xp: Any = np

    def attach(self, context: BackendContext) -> None:
        self._context = context

    def check_arrays(self, call: str, x: Any, out: Any) -> None:
        pass

    @property
    def stager(self) -> MpiBackend:
        return self

    def direct_path(self, books: CallBooks) -> bool:
        """Set ``books`` up for the direct path on this communicator; a blocking one is
        watched (:data:`._watchdog.WATCHDOG`), since nothing else can end it."""
        assert self._context is not None  # attached by the front end first
        books.handle, books.blocking = _direct.handle(self.comm), self.blocking
        books.wait_long, books.pending = self._wait_long, self._direct_pending
        # small synchronous calls may be kept persistent requests, which match no other form
        # of the call: unless told non-blocking, ranks must make calls alike
        books.kept_bytes = self.kept_bytes
        books.kept_all_to_all_in_place = MPI.get_vendor()[0] in KEPT_ALL_TO_ALL_IN_PLACE
        self._books = books
        if books.kept_bytes > 0:
            _KEEPING.add(self)
        if self.blocking:
            WATCHDOG.watch(self._context)
        return True

    def _direct_pending(self, request: Any, entry: Entry, args: tuple) -> MpiPending:
        """The pending of a direct-path call that someone waits on (``books.pending``), in its
        entry's place in the recorder. ``args`` holds the arrays, which MPI may still write
        after a timeout: the pending owns them, and the backend keeps them past an abort."""
        context = self._context
        assert context is not None
        if len(self.in_flight) >= self._reap_at:
            self._reap()
        pending = MpiPending(_direct.request(request), args, self.in_flight)
        pending.info = (entry.seq, entry.call, entry.shape, entry.dtype)
        pending.start = entry.start
        pending.polls = 255  # polled already: its wait looks at the clock after one more test
        # its state, "timed out" included, is the recorder's: the last entry but for a Work's
        recorder = context.recorder
        for i in range(-1, -len(recorder) - 1, -1):
            if recorder[i] is entry:
                recorder[i] = pending
                break
        return pending

    def _wait_long(self, request: Any, entry: Entry, args: tuple) -> None:
        """The rest of a long direct-path wait (``books.wait_long``): yielding the core, under
        the timeout."""
        assert self._context is not None
        self._context.complete(self._direct_pending(request, entry, args))

    # Each verb takes what it needs (see Backend) and gives an MpiPending.

    def all_reduce(self, x: Any, out: Any, name: str, op: ReduceOp) -> MpiPending:
        if _in_float32(name, op):
            return self._via_float32(
                lambda x, out, name: self.all_reduce(x, out, name, op), x, out, name
            )
        if x.size > MAX_COUNT:
            return self._in_parts(lambda x, out: self.all_reduce(x, out, name, op), x, out)
        t = MPI_TYPE[name]
        send = MPI.IN_PLACE if out is x else [x, t]
        return self._post(self.comm.Iallreduce, send, [out, t], MPI_OP[op], then=self._avg(op, out))

    def reduce(self, x: Any, out: Any, name: str, op: ReduceOp, root: int) -> MpiPending:
        if _in_float32(name, op):
            return self._via_float32(
                lambda x, out, name: self.reduce(x, out, name, op, root), x, out, name
            )
        if x.size > MAX_COUNT:
            return self._in_parts(lambda x, out: self.reduce(x, out, name, op, root), x, out)
        t = MPI_TYPE[name]
        if self.rank != root:
            return self._post(self.comm.Ireduce, [x, t], None, MPI_OP[op], root)
        send = MPI.IN_PLACE if out is x else [x, t]
        return self._post(
            self.comm.Ireduce, send, [out, t], MPI_OP[op], root, then=self._avg(op, out)
        )

    def broadcast(self, x: Any, name: str, root: int) -> MpiPending:
        if x.size > MAX_COUNT:
            return self._in_parts(lambda x, out: self.broadcast(x, name, root), x, x)
        return self._post(self.comm.Ibcast, [x, MPI_TYPE[name]], root)

    def all_gather(self, x: Any, out: Any, name: str) -> MpiPending:
        in_place = is_slot(x, out, self.rank)
        if x.size > MAX_COUNT:
            return self._whole(_mpi_parts.all_gather(self, x, out, name, in_place), x, out)
        t = MPI_TYPE[name]
        send = MPI.IN_PLACE if in_place else [x, t]
        return self._post(self.comm.Iallgather, send, [out, t])

    def reduce_scatter(self, x: Any, out: Any, name: str, op: ReduceOp) -> MpiPending:
        if _in_float32(name, op):
            return self._via_float32(
                lambda x, out, name: self.reduce_scatter(x, out, name, op), x, out, name
            )
        if is_slot(out, x, self.rank):
            # MPI's in-place form leaves the result in x[0], not x[rank]: go through a copy.
            result = array_module(out).empty_like(out)
            pending = self.reduce_scatter(x, result, name, op)
            pending.finish = _chain(pending.finish, lambda: _copy(out, result))
            return pending
        if out.size > MAX_COUNT:
            return self._whole(_mpi_parts.reduce_scatter(self, x, out, name, op), x, out)
        t = MPI_TYPE[name]
        if (
            self.size == 2
            and _direct.EXCHANGES
            and out.nbytes > self.kept_bytes
            and not is_device_array(x)
        ):
            return self._exchange(x, out, t, op)  # as the direct path makes it
        if _direct.COUNTED_REDUCE_SCATTER & 1 and out.nbytes >= _direct.COUNTED_FROM:
            # as the direct path posts it on MPICH
            counts = [out.size] * self.size
            return self._post(
                self.comm.Ireduce_scatter,
                [x, t],
                [out, t],
                counts,
                MPI_OP[op],
                then=self._avg(op, out),
            )
        return self._post(
            self.comm.Ireduce_scatter_block, [x, t], [out, t], MPI_OP[op], then=self._avg(op, out)
        )

    def _exchange(self, x: Any, out: Any, t: MPI.Datatype, op: ReduceOp) -> MpiPending:
        """A two-rank reduce_scatter as one exchange (``_direct.EXCHANGES``): the part
        the peer keeps goes to it, its part of ours comes into ``out``, then ours is reduced
        into that."""
        peer, mine, mpi_op = 1 - self.rank, x[self.rank], MPI_OP[op]

        def reduce() -> None:
            mpi_op.Reduce_local([mine, t], [out, t])

        avg = self._avg(op, out)
        return self._post(
            self.comm.Isendrecv,
            [x[peer], t],
            peer,
            EXCHANGE_TAG,
            [out, t],
            peer,
            EXCHANGE_TAG,
            then=reduce if avg is None else _chain(reduce, avg),
        )

    def all_to_all(self, x: Any, out: Any, name: str) -> MpiPending:
        if x.size // self.size > MAX_COUNT:
            return self._whole(_mpi_parts.all_to_all(self, x, out, name, MAX_COUNT), x, out)
        t = MPI_TYPE[name]
        send = MPI.IN_PLACE if out is x else [x, t]
        return self._post(self.comm.Ialltoall, send, [out, t])

    def gather(self, x: Any, out: Any, name: str, root: int) -> MpiPending:
        if x.size > MAX_COUNT:
            in_place = is_slot(x, out, self.rank)
            parts = _mpi_parts.gather(self, x, out, name, root, in_place, MAX_COUNT)
            return self._whole(parts, x, out)
        t = MPI_TYPE[name]
        if self.rank != root:
            return self._post(self.comm.Igather, [x, t], None, root)
        send = MPI.IN_PLACE if is_slot(x, out, root) else [x, t]
        return self._post(self.comm.Igather, send, [out, t], root)

    def scatter(self, x: Any, out: Any, name: str, root: int) -> MpiPending:
        if out.size > MAX_COUNT:
            in_place = is_slot(out, x, self.rank)
            parts = _mpi_parts.scatter(self, x, out, name, root, in_place, MAX_COUNT)
            return self._whole(parts, x, out)
        t = MPI_TYPE[name]
        if self.rank != root:
            return self._post(self.comm.Iscatter, None, [out, t], root)
        receive = MPI.IN_PLACE if is_slot(out, x, root) else [out, t]
        return self._post(self.comm.Iscatter, [x, t], receive, root)

    def send(self, x: Any, name: str, peer: int) -> MpiPending:
        if x.size > MAX_COUNT:
            return self._whole(_mpi_parts.sends(self, x, name, peer, _TAG, MAX_COUNT), x, None)
        return self._post(self.comm.Isend, [x, MPI_TYPE[name]], peer, _TAG)

    def recv(self, out: Any, name: str, peer: int) -> MpiPending:
        if out.size > MAX_COUNT:
            return self._whole(_mpi_parts.recvs(self, out, name, peer, _TAG, MAX_COUNT), None, out)
        return self._post(self.comm.Irecv, [out, MPI_TYPE[name]], peer, _TAG)

    def sendrecv(self, x: Any, out: Any, name: str, peer: int, source: int) -> MpiPending:
        if x.size > MAX_COUNT or not _direct.SENDRECV_POSTED:  # (before MPI 4.0)
            # a recv and a send that complete together: they match the peers' as one would
            parts = [self.recv(out, name, source), self.send(x, name, peer)]
            return self._whole(parts, x, out)
        t = MPI_TYPE[name]
        return self._post(self.comm.Isendrecv, [x, t], peer, _TAG, [out, t], source, _TAG)

    def barrier(self) -> MpiPending:
        return self._post(self.comm.Ibarrier)

    def _post(
        self,
        start: Callable[..., MPI.Request],
        *args: Any,
        then: Callable[[], None] | None = None,
    ) -> MpiPending:
        """Post ``start(*args)``: the pending owns ``args``, every buffer MPI reads or writes,
        until the request completes (this is the one place requests are made)."""
        if len(self.in_flight) >= self._reap_at:
            self._reap()
        return MpiPending(start(*args), args, self.in_flight, then)

    def _reap(self) -> None:
        """Complete the calls nobody waits for (their ``Work`` was dropped), so that
        ``in_flight`` stays small: a look every time it has doubled."""
        for pending in list(self.in_flight):
            pending.test()
        self._reap_at = max(_REAP_AT, 2 * len(self.in_flight))

    # Helpers shared by the verbs.

    def _in_parts(self, verb: Callable[[Any, Any], MpiPending], x: Any, out: Any) -> MpiPending:
        """An element-wise call ``verb(x, out)`` on more than ``MAX_COUNT`` elements, as one
        call per part of at most that many (in the same order on every rank), completing
        together."""
        flat_x = x.reshape(-1)
        flat_out = None if out is None else (flat_x if out is x else out.reshape(-1))
        parts = []
        for start in range(0, flat_x.size, MAX_COUNT):
            part_x = flat_x[start : start + MAX_COUNT]
            part_out = (
                None
                if flat_out is None
                else (part_x if flat_out is flat_x else flat_out[start : start + MAX_COUNT])
            )
            parts.append(verb(part_x, part_out))
        return self._whole(parts, x, out)

    def _whole(self, parts: list[MpiPending], x: Any, out: Any) -> MpiPending:
        """One pending for a call made of ``parts`` (see :mod:`._mpi_parts`)."""
        # _AllOf answers Test(), all that a pending asks of its request
        return MpiPending(cast(MPI.Request, _AllOf(parts)), (x, out), self.in_flight)

    def _avg(self, op: ReduceOp | None, out: Any) -> Callable[[], None] | None:
        if op is not ReduceOp.AVG:
            return None
        size = self.size
        return lambda: divide_in_place(out, size)

    def _via_float32(
        self, verb: Callable[[Any, Any, str], MpiPending], x: Any, out: Any, name: str
    ) -> MpiPending:
        """``verb(x, out, name)`` of a 16-bit float type (UPCAST) on float32 copies."""
        wide_x = _decode(x, name)
        xp = array_module(wide_x)
        wide_out = (
            None if out is None else (wide_x if out is x else xp.empty(out.shape, xp.float32))
        )
        pending = verb(wide_x, wide_out, "float32")
        if out is not None:
            pending.finish = _chain(pending.finish, lambda: _encode(wide_out, out, name))
        return pending

    def staged(self, verb: Verb, x: Any, out: Any) -> Pending:
        """Run ``verb(x, out)`` on host copies of CuPy arrays, copying ``out`` back when done."""
        import cupy

        if self.cuda_aware:
            cupy.cuda.get_current_stream().synchronize()
            return verb(x, out)
        host_x = None if x is None else cupy.asnumpy(x)
        if out is None:
            host_out = None
        elif out is x:
            host_out = host_x
        else:
            host_out = np.empty(out.shape, out.dtype)
        pending = verb(host_x, host_out)
        if out is not None:
            pending.finish = _chain(pending.finish, lambda: out.set(host_out))
        return pending

    def run(self, verb: Verb, x: Any, out: Any) -> Pending:
        """``verb(x, out)``, staged (:meth:`staged`) where an array is CuPy's (the stager's
        one call, which the front end makes for every general-path call)."""
        if (
            "cupy" in sys.modules  # no CuPy imported: no device arrays to stage
            and (type(x) not in _HOST or type(out) not in _HOST)
            and (is_device_array(x) or is_device_array(out))
        ):
            return self.staged(verb, x, out)
        return verb(x, out)

    def group_start(self) -> None:
        pass

    def group_end(self, pendings: list) -> None:
        pass

    def split(self, child: MPI.Comm, color: int | None, key: int) -> tuple[Any, dict]:
        if child == MPI.COMM_NULL:
            return None, {}
        return MpiBackend(child, self.cuda_aware, self._blocking_told), {}

    def drain(self) -> None:
        """Finish the calls in flight before a close (under the timeout: a call that never
        completes is abandoned by the close instead)."""
        context = self._context
        assert context is not None
        if self._books is not None:
            self._books.hand_over()  # the direct path's Works, as pendings in in_flight
        for pending in list(self.in_flight):
            try:
                context.synchronize(pending)
            except CollectiveTimeoutError:
                return

    def close(self) -> None:
        self.abort()

    def abort(self) -> None:
        # What MPI has not finished keeps its arrays, and its communicator (see ``unfinished``).
        if self._books is not None:
            self._books.hand_over()
        self.unfinished = abandon(self.in_flight) > 0 or self.unfinished
        self.let_go_kept()

    def let_go_kept(self) -> None:
        """Free the kept persistent requests of the direct path (before the communicator is
        freed, or MPI finalized); one still active leaves the communicator unfreed."""
        if self._books is not None and not MPI.Is_finalized():
            self.unfinished = self._books.let_go_kept() > 0 or self.unfinished
        _KEEPING.discard(self)


#: the backends whose books may keep persistent requests, let go of at exit before
#: MPI_Finalize (which would otherwise free them, saying so, on MPICH)
_KEEPING: weakref.WeakSet[MpiBackend] = weakref.WeakSet()


#: whether :func:`ready` has registered the exit handler below
_READY: list[bool] = []


def ready() -> None:
    """What the MPI backend needs, made by the first one (or ``init``), not at import: the
    tables (:func:`._direct.fill_tables`, which take MPI calls) and the exit handler below."""
    _direct.fill_tables()
    if not _READY:
        _READY.append(True)
        atexit.register(_let_go_all_kept)


def _let_go_all_kept() -> None:
    if _fork.forked():  # the requests are the parent's
        return
    for backend in list(_KEEPING):
        backend.let_go_kept()
