"""The MPI backend: mpi4py's non-blocking buffer calls on NumPy arrays (never pickling).

Every verb takes the arguments it needs (:class:`~collectives._core.backend.Backend` lists them; the front
end has checked them) and returns a :class:`MpiPending`. CuPy arrays are staged through
host memory unless the MPI library is CUDA-aware (:meth:`MpiBackend.run`).

Which MPI call a verb makes (blocking or not, in parts above 2**31 - 1 elements, a two-rank
reduce_scatter as one exchange...) depends only on what every rank agrees on: the verb, the
dtype, the count, the op, the root, the communicator's settings and the MPI library; never on
the Python type of the arrays a rank passes, nor on ``async_op``, as MPI matches no blocking
call with a non-blocking one. The tables it stands on are in :mod:`collectives._mpi.tables`;
a call in flight is a :class:`collectives._core.work.MpiPending`.
"""

from __future__ import annotations

import ctypes
import functools
import sys
from time import monotonic
from typing import Any, Callable, cast

import numpy as np
from mpi4py import MPI

from .._arrays import array_module, is_device_array, is_slot
from .._core.backend import BackendContext, Verb
from .._core.work import COMPLETED, MpiPending, Pending, chain
from .._errors import CollectivesError
from .._numerics import bfloat16_to_float32, divide_in_place, float32_to_bfloat16
from .._ops import AVG, ReduceOp
from .._safety.progress import BLOCKING_CALLS
from . import parts as _mpi_parts
from .tables import (  # noqa: F401  (the backend's names, imported from here)
    _ABANDONED,
    _TAG,
    EXCHANGE_TAG,
    MPI_OP,
    MPI_TYPE,
    SLOWER_NON_BLOCKING,
    UPCAST,
    abandon,
    blocking_by_default,
    library_path,
    mpi_cuda_aware,
    mpi_tables,
)
from .watchdog import WATCHDOG

#: calls in flight on one communicator, and calls made, before those done are looked for
_REAP_AT = 64

#: tests of a request as it is posted, before it is handed back as a pending: a small call
#: done within them makes no pending, no poll loop and no completion step, whose Python, at
#: two ranks, lies on the path of each call of both ranks (2 ranks, MPICH, 8 B to 1 KiB:
#: all_reduce 2.4x-2.5x raw mpi4py's time with one test, 2.0x-2.2x with 16;
#: benchmarks/results/cpu-2core-2026-11-27-lean-path/). One only where the rank shares its
#: core, whose peer may need it (the waits yield it there from the first test).
TESTS_AT_POST = 16
_TESTS_AT_POST, _ONE_TEST = range(TESTS_AT_POST), range(1)


def _decode(x: Any, name: str) -> Any:
    return bfloat16_to_float32(x) if name == "bfloat16" else x.astype(np.float32)


def _encode(values: Any, out: Any, name: str) -> None:
    if name == "bfloat16":
        float32_to_bfloat16(values, out)
    else:
        out[...] = values


def _copy(out: Any, result: Any) -> None:
    out[...] = result


#: elements one MPI call is given: counts are C ints where MPI has no large-count calls
#: (Open MPI 5), so larger calls are made in parts (``MpiBackend._in_parts``, and for the
#: verbs that are not element-wise, :mod:`collectives._mpi.parts`)
MAX_COUNT = 2**31 - 1


def _in_float32(name: str, op: ReduceOp | None) -> bool:
    """Whether a reduction of dtype ``name`` runs on float32 copies: those this MPI cannot
    reduce (UPCAST), and float16's AVG on every MPI, whose sum would overflow (past 65504)
    where the mean does not, as NCCL's avg (which divides before summing) never does."""
    return name in UPCAST or (op is AVG and name == "float16")


#: the dtypes some reduction of which may run on float32 copies, looked up first: the others
#: never do (UPCAST only ever gains float16)
NARROW = UPCAST | {"float16"}


class _AllOf:
    """The request of a call made in parts: complete once every part is."""

    def __init__(self, parts: list[MpiPending]):
        self.parts = parts

    def Test(self) -> bool:  # noqa: N802 - as MPI.Request's
        return all([part.test() for part in self.parts])


#: the blocking form of each non-blocking call the verbs post, where the communicator's
#: collectives are blocking (``init(mpi_blocking=True)``). Point-to-point calls (send, recv,
#: sendrecv, and the exchange of a two-rank reduce_scatter) never block: MPI matches either
#: form of them with the other, and one that blocked inside ``comm.group()`` would wait for a
#: peer's send that the peer's group has not posted yet
_BLOCKING_FORM: dict[Callable[..., MPI.Request], Callable[..., None]] = {
    MPI.Comm.Iallreduce: MPI.Comm.Allreduce,
    MPI.Comm.Ireduce: MPI.Comm.Reduce,
    MPI.Comm.Ibcast: MPI.Comm.Bcast,
    MPI.Comm.Iallgather: MPI.Comm.Allgather,
    MPI.Comm.Ireduce_scatter: MPI.Comm.Reduce_scatter,
    MPI.Comm.Ireduce_scatter_block: MPI.Comm.Reduce_scatter_block,
    MPI.Comm.Ialltoall: MPI.Comm.Alltoall,
    MPI.Comm.Igather: MPI.Comm.Gather,
    MPI.Comm.Iscatter: MPI.Comm.Scatter,
    MPI.Comm.Ibarrier: MPI.Comm.Barrier,
}

#: at one rank, a broadcast and a collective in place (``MPI.IN_PLACE`` its send buffer, or
#: scatter's receive buffer) move nothing: their result there is their input (``is``, never
#: ``==``: Open MPI's IN_PLACE equals 1)
_IN_PLACE, _IBCAST = MPI.IN_PLACE, MPI.Comm.Ibcast

#: the progress board's code of each call that may block (``BLOCKING_CALLS``)
_INSIDE_CODE = {call: code for code, call in BLOCKING_CALLS.items()}


class _Library:
    """What this MPI library can do, found once, on first use (never at import)."""

    def __init__(self) -> None:
        vendor = MPI.get_vendor()[0]
        #: a sendrecv is one MPI call (``MPI_Isendrecv``, MPI 4.0); without it, an
        #: ``MPI_Irecv`` and an ``MPI_Isend`` that complete together
        self.sendrecv_posted = _has_isendrecv()
        #: which reduce_scatters are posted with each rank's count (1 the non-blocking ones, 2
        #: the blocking ones): MPICH's ``MPI_Ireduce_scatter_block`` and Open MPI's
        #: ``MPI_Reduce_scatter_block`` pick algorithms several times slower from 128 KiB than
        #: the same libraries' ``MPI_(I)reduce_scatter`` (2 ranks, 15x and 6x at 1 MiB;
        #: benchmarks/results/cpu-2core-2026-11-25-c-work/); elsewhere the two cost the same
        self.counted_reduce_scatter = {"MPICH": 1, "Open MPI": 2}.get(vendor, 0)
        #: bytes from which a reduce is made as an all_reduce (the ranks but the root receive
        #: into a scratch buffer), for the non-blocking and the blocking form of the call
        #: (None: never), at more than one rank, where this library's reduce is the slower of
        #: the two: MPICH's took 2.6x to 3.9x its all_reduce's time from 256 KiB (either
        #: form), Intel MPI's ``MPI_Ireduce`` 2.8x to 4.8x from 256 KiB, Open MPI's 1.1x to
        #: 1.4x from 1 MiB (2 ranks; benchmarks/results/cpu-2core-2026-11-27-lean-path/)
        self.reduce_as_all_reduce_from: tuple[int | None, int | None] = {
            "MPICH": (256 << 10, 256 << 10),
            "Intel MPI": (256 << 10, None),
            "Open MPI": (1 << 20, None),
        }.get(vendor, (None, None))


#: bytes per rank from which reduce_scatters are posted counted (below, the two cost the same)
COUNTED_FROM = 64 << 10


def _has_isendrecv() -> bool:
    """Whether this MPI has ``MPI_Isendrecv`` (MPI 4.0) and mpi4py calls it."""
    if not hasattr(MPI.Comm, "Isendrecv"):
        return False
    path = library_path()
    try:
        return path is not None and hasattr(ctypes.CDLL(path), "MPI_Isendrecv")
    except OSError:
        return False


@functools.cache
def library() -> _Library:
    """This MPI library's abilities (the same on every rank: one library)."""
    return _Library()


class MpiBackend:
    """Collectives over one mpi4py communicator."""

    name = "mpi"

    def __init__(
        self, mpi_comm: MPI.Comm, cuda_aware: bool | None = None, blocking: bool | None = None
    ):
        mpi_tables()  # made by the first backend (or init), never at import
        self.comm = mpi_comm
        self.size = mpi_comm.Get_size()
        self.rank = mpi_comm.Get_rank()
        self.cuda_aware = mpi_cuda_aware() if cuda_aware is None else cuda_aware
        #: collectives (every verb but send and recv, synchronous or not) are blocking MPI
        #: calls (see ``init(mpi_blocking=)``)
        self.blocking = blocking_by_default() if blocking is None else blocking
        self._forms = _BLOCKING_FORM if self.blocking else {}
        self._library = library()
        #: when the blocking call this backend is inside began (0.0: none), for the watchdog
        self.blocked_since = 0.0
        self.in_flight: set[MpiPending] = set()
        self._reap_at = _REAP_AT
        self._until_reap = _REAP_AT
        #: what the front end's waits follow (``yield_after``: 0 where this rank shares its
        #: core); set by :meth:`attach`, which comes before any call
        self._waiter: Any = None
        #: the host buffer that reduces made as all_reduces receive into where the rank is not
        #: the root (:meth:`_spare`), and whether a call in flight uses it
        self._spare_bytes = np.empty(0, np.uint8)
        self._spare_in_use = False
        #: calls were left in flight at a close or abort: the MPI communicator is not freed
        self.unfinished = False
        self._context: BackendContext | None = None

    #: an MPI backend fails through the front end only (a timeout, an MPI error)
    failure: CollectivesError | None = None
    #: MPI takes any array it is given (device arrays are staged)
    checks_arrays = False
    #: NumPy arrays (CuPy ones are staged through the host)
    xp: Any = np

    def attach(self, context: BackendContext) -> None:
        """Take the front end's context; a blocking backend is watched
        (:data:`collectives._mpi.watchdog.WATCHDOG`), since nothing else can end a call stuck in MPI."""
        self._context = context
        self._waiter = context.waiter
        if self.blocking:
            WATCHDOG.watch(self)

    def check_arrays(self, call: str, x: Any, out: Any) -> None:
        pass

    @property
    def call_form(self) -> str:
        if self.blocking:
            return (
                "blocking MPI collectives (a stuck one ends the job after the timeout), "
                "non-blocking point-to-point calls"
            )
        return "non-blocking MPI calls, polled under the timeout"

    @property
    def stager(self) -> MpiBackend:
        return self

    # Each verb takes what it needs (see Backend) and gives an MpiPending. The MPI call is
    # passed unbound (``MPI.Comm.Iallreduce``) to ``_post``, which posts it or makes its
    # blocking form.

    def all_reduce(self, x: Any, out: Any, name: str, op: ReduceOp) -> MpiPending:
        if name in NARROW and _in_float32(name, op):
            return self._via_float32(
                lambda x, out, name: self.all_reduce(x, out, name, op), x, out, name
            )
        if x.size > MAX_COUNT:
            return self._in_parts(lambda x, out: self.all_reduce(x, out, name, op), x, out)
        t = MPI_TYPE[name]
        send = MPI.IN_PLACE if out is x else [x, t]
        then = None if op is not AVG else self._avg(op, out)
        return self._post(MPI.Comm.Iallreduce, send, [out, t], MPI_OP[op], then=then)

    def reduce(self, x: Any, out: Any, name: str, op: ReduceOp, root: int) -> MpiPending:
        from_bytes = self._library.reduce_as_all_reduce_from[self.blocking]
        if from_bytes is not None and x.nbytes >= from_bytes and self.size > 1:
            # this library's reduce is the slower: an all_reduce, which every rank makes
            # alike (the same size) and out of place (MPI's in-place form is every rank's or
            # none's), whose result the ranks but the root do not keep
            if self.rank != root:
                spare = self._spare(x)
                pending = self.all_reduce(x, spare, name, op)
            elif out is x:
                spare = self._spare(x)
                spare[...] = x
                pending = self.all_reduce(spare, out, name, op)
            else:
                return self.all_reduce(x, out, name, op)
            pending.then(lambda: self._give_back(spare))
            return pending
        if name in NARROW and _in_float32(name, op):
            return self._via_float32(
                lambda x, out, name: self.reduce(x, out, name, op, root), x, out, name
            )
        if x.size > MAX_COUNT:
            return self._in_parts(lambda x, out: self.reduce(x, out, name, op, root), x, out)
        t = MPI_TYPE[name]
        if self.rank != root:
            return self._post(MPI.Comm.Ireduce, [x, t], None, MPI_OP[op], root)
        send = MPI.IN_PLACE if out is x else [x, t]
        return self._post(
            MPI.Comm.Ireduce, send, [out, t], MPI_OP[op], root, then=self._avg(op, out)
        )

    def broadcast(self, x: Any, name: str, root: int) -> MpiPending:
        if x.size > MAX_COUNT:
            return self._in_parts(lambda x, out: self.broadcast(x, name, root), x, x)
        return self._post(MPI.Comm.Ibcast, [x, MPI_TYPE[name]], root)

    def all_gather(self, x: Any, out: Any, name: str) -> MpiPending:
        in_place = is_slot(x, out, self.rank)
        if x.size > MAX_COUNT:
            return self._whole(_mpi_parts.all_gather(self, x, out, name, in_place), x, out)
        t = MPI_TYPE[name]
        send = MPI.IN_PLACE if in_place else [x, t]
        return self._post(MPI.Comm.Iallgather, send, [out, t])

    def reduce_scatter(self, x: Any, out: Any, name: str, op: ReduceOp) -> MpiPending:
        if name in NARROW and _in_float32(name, op):
            return self._via_float32(
                lambda x, out, name: self.reduce_scatter(x, out, name, op), x, out, name
            )
        in_place = is_slot(out, x, self.rank)
        if in_place and (self.size > 1 or out.size > MAX_COUNT):
            # MPI's in-place form leaves the result in x[0], which is x[rank] at one rank
            # only: elsewhere go through a copy.
            result = array_module(out).empty_like(out)
            pending = self.reduce_scatter(x, result, name, op)
            pending.then(lambda: _copy(out, result))
            return pending
        if out.size > MAX_COUNT:
            return self._whole(_mpi_parts.reduce_scatter(self, x, out, name, op), x, out)
        t = MPI_TYPE[name]
        if self.size == 2 and self._library.sendrecv_posted and not self.cuda_aware:
            return self._exchange(x, out, t, op)
        send, receive = (MPI.IN_PLACE, [x, t]) if in_place else ([x, t], [out, t])
        counted = self._library.counted_reduce_scatter & (2 if self.blocking else 1)
        if counted and out.nbytes >= COUNTED_FROM:
            counts = [out.size] * self.size
            return self._post(
                MPI.Comm.Ireduce_scatter, send, receive, counts, MPI_OP[op], then=self._avg(op, out)
            )
        return self._post(
            MPI.Comm.Ireduce_scatter_block, send, receive, MPI_OP[op], then=self._avg(op, out)
        )

    def _exchange(self, x: Any, out: Any, t: MPI.Datatype, op: ReduceOp) -> MpiPending:
        """A two-rank reduce_scatter as one exchange: the part the peer keeps goes to it, its
        part of ours comes into ``out``, then ours is reduced into that. MPICH's, Open MPI's
        and Intel MPI's own reduce_scatter took 1.1x to 7.9x its time from 16 KiB a call to
        16 MiB, 0.9x to 1.2x at 4 KiB (benchmarks/results/
        cpu-2core-2026-11-27-exchange/). Made on host memory only (``MPI_Reduce_local`` reads it): never where
        device arrays may reach MPI (CUDA-aware), so that every rank makes the same call."""
        peer, mine, mpi_op = 1 - self.rank, x[self.rank], MPI_OP[op]

        def reduce() -> None:
            mpi_op.Reduce_local([mine, t], [out, t])

        avg = self._avg(op, out)
        return self._post(
            MPI.Comm.Isendrecv,
            [x[peer], t],
            peer,
            EXCHANGE_TAG,
            [out, t],
            peer,
            EXCHANGE_TAG,
            then=reduce if avg is None else chain(reduce, avg),
        )

    def all_to_all(self, x: Any, out: Any, name: str) -> MpiPending:
        if x.size // self.size > MAX_COUNT:
            return self._whole(_mpi_parts.all_to_all(self, x, out, name, MAX_COUNT), x, out)
        t = MPI_TYPE[name]
        send = MPI.IN_PLACE if out is x else [x, t]
        return self._post(MPI.Comm.Ialltoall, send, [out, t])

    def gather(self, x: Any, out: Any, name: str, root: int) -> MpiPending:
        if x.size > MAX_COUNT:
            in_place = is_slot(x, out, self.rank)
            parts = _mpi_parts.gather(self, x, out, name, root, in_place, MAX_COUNT)
            return self._whole(parts, x, out)
        t = MPI_TYPE[name]
        if self.rank != root:
            return self._post(MPI.Comm.Igather, [x, t], None, root)
        send = MPI.IN_PLACE if is_slot(x, out, root) else [x, t]
        return self._post(MPI.Comm.Igather, send, [out, t], root)

    def scatter(self, x: Any, out: Any, name: str, root: int) -> MpiPending:
        if out.size > MAX_COUNT:
            in_place = is_slot(out, x, self.rank)
            parts = _mpi_parts.scatter(self, x, out, name, root, in_place, MAX_COUNT)
            return self._whole(parts, x, out)
        t = MPI_TYPE[name]
        if self.rank != root:
            return self._post(MPI.Comm.Iscatter, None, [out, t], root)
        receive = MPI.IN_PLACE if is_slot(out, x, root) else [out, t]
        return self._post(MPI.Comm.Iscatter, [x, t], receive, root)

    def send(self, x: Any, name: str, peer: int) -> MpiPending:
        if x.size > MAX_COUNT:
            return self._whole(_mpi_parts.sends(self, x, name, peer, _TAG, MAX_COUNT), x, None)
        return self._post(MPI.Comm.Isend, [x, MPI_TYPE[name]], peer, _TAG)

    def recv(self, out: Any, name: str, peer: int) -> MpiPending:
        if out.size > MAX_COUNT:
            return self._whole(_mpi_parts.recvs(self, out, name, peer, _TAG, MAX_COUNT), None, out)
        return self._post(MPI.Comm.Irecv, [out, MPI_TYPE[name]], peer, _TAG)

    def sendrecv(self, x: Any, out: Any, name: str, peer: int, source: int) -> MpiPending:
        if x.size > MAX_COUNT or not self._library.sendrecv_posted:  # (before MPI 4.0)
            # a recv and a send that complete together: they match the peers' as one would
            parts = [self.recv(out, name, source), self.send(x, name, peer)]
            return self._whole(parts, x, out)
        t = MPI_TYPE[name]
        return self._post(MPI.Comm.Isendrecv, [x, t], peer, _TAG, [out, t], source, _TAG)

    def barrier(self) -> MpiPending:
        return self._post(MPI.Comm.Ibarrier)

    def _post(
        self,
        start: Callable[..., MPI.Request],
        *args: Any,
        then: Callable[[], None] | None = None,
    ) -> MpiPending:
        """Post ``start(comm, *args)``, or make its blocking form where this communicator's
        collectives are blocking: the pending owns ``args``, every buffer MPI reads or writes,
        until the request completes (this is the one place MPI calls are made)."""
        self._until_reap -= 1
        if self._until_reap <= 0 or len(self.in_flight) >= self._reap_at:
            self._reap()
        blocking = self._forms.get(start)
        if self.size == 1 and (
            start is _IBCAST or (len(args) > 1 and (args[0] is _IN_PLACE or args[1] is _IN_PLACE))
        ):
            pass  # alone, and moving nothing: MPI is not called (some libraries copy even then)
        elif blocking is None:
            request = start(self.comm, *args)
            tests = _TESTS_AT_POST if self._waiter.yield_after else _ONE_TEST
            for _ in tests:  # a small call is most often done within a few
                if request.Test():
                    break
            else:
                return MpiPending(request, args, self.in_flight, then)
        else:
            self._block(blocking, args)
        # complete already: ``then`` runs now, as will what the verbs add (``then()``)
        if then is not None:
            then()
        return COMPLETED

    def _block(self, call: Callable[..., None], args: tuple) -> None:
        """Make the blocking MPI call ``call(comm, *args)``, posted on the progress board and
        watched by the watchdog while it runs (it cannot be interrupted)."""
        context = self._context
        assert context is not None  # attached by the front end first
        context.inside(_INSIDE_CODE.get(context.current()[1], 0))
        self.blocked_since = monotonic()
        try:
            call(self.comm, *args)
        finally:
            self.blocked_since = 0.0
            context.inside(0)

    def _spare(self, like: Any) -> Any:
        """An array of ``like``'s shape and dtype that no call in flight uses, for a reduce
        made as an all_reduce: the backend's spare host buffer (grown to the largest asked
        for, and kept), or a new array where that is in use or ``like`` is on a device. A new
        host buffer of a MiB each call costs its page faults, as much as the reduce saves."""
        if array_module(like) is not np or self._spare_in_use:
            return array_module(like).empty_like(like)
        if self._spare_bytes.nbytes < like.nbytes:
            self._spare_bytes = np.empty(like.nbytes, np.uint8)
        self._spare_in_use = True
        return self._spare_bytes[: like.nbytes].view(like.dtype).reshape(like.shape)

    def _give_back(self, spare: Any) -> None:
        """The call that used ``spare`` has completed: the spare host buffer is free again."""
        if spare.base is self._spare_bytes:  # (not a new array made while it was in use)
            self._spare_in_use = False

    def _reap(self) -> None:
        """Complete the calls nobody waits for (their ``Work`` was dropped), so that
        ``in_flight`` stays small and their arrays go: a look every ``_REAP_AT`` calls, and
        every time it has doubled."""
        for pending in list(self.in_flight):
            pending.test()
        self._reap_at = max(_REAP_AT, 2 * len(self.in_flight))
        self._until_reap = _REAP_AT

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
        """One pending for a call made of ``parts`` (see :mod:`collectives._mpi.parts`)."""
        # _AllOf answers Test(), all that a pending asks of its request
        return MpiPending(cast(MPI.Request, _AllOf(parts)), (x, out), self.in_flight)

    def _avg(self, op: ReduceOp | None, out: Any) -> Callable[[], None] | None:
        if op is not AVG:
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
            pending.then(lambda: _encode(wide_out, out, name))
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
            pending.then(lambda: out.set(host_out))
        return pending

    def run(self, verb: Verb, x: Any, out: Any) -> Pending:
        """``verb(x, out)``, staged (:meth:`staged`) where an array is CuPy's (the stager's
        one call, which the front end makes where an array is not NumPy's)."""
        if "cupy" in sys.modules and (is_device_array(x) or is_device_array(out)):
            return self.staged(verb, x, out)
        return verb(x, out)

    def group_start(self) -> None:
        pass

    def group_end(self, pendings: list) -> None:
        pass

    def split(self, child: MPI.Comm, color: int | None, key: int) -> tuple[Any, dict]:
        if child == MPI.COMM_NULL:
            return None, {}
        return MpiBackend(child, self.cuda_aware, self.blocking), {}

    def drain(self) -> None:
        """Finish the calls in flight before a close (under the timeout: a call that never
        completes is abandoned by the close instead)."""
        context = self._context
        assert context is not None
        for pending in list(self.in_flight):
            try:
                context.synchronize(pending)
            except CollectivesError:  # timed out, or failed on a peer: abandoned
                return

    def close(self) -> None:
        self.abort()

    def abort(self) -> None:
        # What MPI has not finished keeps its arrays, and its communicator (see ``unfinished``).
        self.unfinished = abandon(self.in_flight) > 0 or self.unfinished
