"""The MPI backend: mpi4py's non-blocking buffer calls on NumPy arrays (never pickling).

Every verb takes the same arguments ``(x, out, name, op, root)`` (the
front end has checked them) and returns a :class:`MpiPending`. CuPy arrays are staged
through host memory unless the MPI library is CUDA-aware.
"""

from __future__ import annotations

import ctypes
import os
import re
import time
from typing import Any, Callable, cast

import numpy as np
from mpi4py import MPI

from . import _mpi_parts
from ._arrays import array_module, is_device_array, is_slot
from ._backend import Verb
from ._dtypes import COMPLEX, NAME_OF_CHAR
from ._errors import CollectiveTimeoutError
from ._numerics import bfloat16_to_float32, divide_in_place, float32_to_bfloat16
from ._ops import BY_NAME, ReduceOp
from ._work import Pending


def _mpi_type(name: str) -> MPI.Datatype:
    return getattr(MPI, name, MPI.DATATYPE_NULL)


def _reduces_float16() -> bool:
    """Whether this MPI sums float16 natively. A non-null ``MPI.FLOAT16_T`` is not enough:
    Open MPI 4.1 gives one that every call then rejects (``MPI_ERR_TYPE``)."""
    t = _mpi_type("FLOAT16_T")
    if t == MPI.DATATYPE_NULL:
        return False
    ones, out = np.ones(2, np.float16), np.zeros(2, np.float16)
    try:
        MPI.COMM_SELF.Allreduce([ones, t], [out, t], MPI.SUM)
    except MPI.Exception:
        return False
    return bool((out == ones).all())


_HAS_FLOAT16 = _reduces_float16()

#: dtype name -> MPI datatype that moves (and, unless in UPCAST, reduces) it
MPI_TYPE = {
    "int8": MPI.INT8_T,
    "uint8": MPI.UINT8_T,
    "int32": MPI.INT32_T,
    "uint32": MPI.UINT32_T,
    "int64": MPI.INT64_T,
    "uint64": MPI.UINT64_T,
    "float16": MPI.FLOAT16_T if _HAS_FLOAT16 else MPI.UINT16_T,
    "float32": MPI.FLOAT,
    "float64": MPI.DOUBLE,
    "bfloat16": MPI.UINT16_T,
    "complex64": MPI.C_FLOAT_COMPLEX,
    "complex128": MPI.C_DOUBLE_COMPLEX,
}

#: dtypes this MPI cannot reduce natively: reduced in float32, then rounded back
UPCAST = frozenset({"bfloat16"} if _HAS_FLOAT16 else {"bfloat16", "float16"})

#: ReduceOp -> MPI op (AVG is a sum divided afterwards); keyed for the verbs' ``op``, which
#: the front end has checked is a ReduceOp wherever the call reduces
MPI_OP: dict[ReduceOp | None, MPI.Op] = {
    ReduceOp.SUM: MPI.SUM,
    ReduceOp.PROD: MPI.PROD,
    ReduceOp.MAX: MPI.MAX,
    ReduceOp.MIN: MPI.MIN,
    ReduceOp.AVG: MPI.SUM,
}

#: native-order dtype -> (name, MPI type) for the dtypes MPI reduces natively: the direct
#: path's table (_direct.FAST_TYPE), looked up once per call (a swapped byte order is not
#: equal, so it misses; complex is left to the checked path: it has no max or min)
FAST_TYPE_OBJECTS = {
    np.dtype(ch): (name, MPI_TYPE[name])
    for ch, name in NAME_OF_CHAR.items()
    if name not in UPCAST and name not in COMPLEX
}

#: the op as users pass it ("sum" or ReduceOp.SUM) -> (ReduceOp, MPI op), AVG excepted
FAST_OP_OBJECTS = {key: (op, MPI_OP[op]) for key, op in BY_NAME.items() if op is not ReduceOp.AVG}

_TAG = 7071
_REAP_AT = 64  # calls in flight on one communicator before those done are looked for


def mpi_cuda_aware() -> bool:
    """Whether CuPy arrays may be handed to MPI directly (env ``COLLECTIVES_MPI_CUDA_AWARE``)."""
    forced = os.environ.get("COLLECTIVES_MPI_CUDA_AWARE")
    if forced is not None:
        return forced == "1"
    try:
        # mpi4py loads libmpi privately: its symbols are not the process's, so open it by name
        query = ctypes.CDLL(library_path()).MPIX_Query_cuda_support
    except (AttributeError, OSError):
        return False
    return bool(query())


#: MPI libraries whose non-blocking collectives are slower than their blocking ones (measured:
#: benchmarks/README.md), where synchronous calls are blocking ones unless told otherwise
SLOWER_NON_BLOCKING = frozenset({"Open MPI", "Intel MPI"})


def blocking_by_default() -> bool:
    """``COLLECTIVES_MPI_BLOCKING`` (``1``/``0``), else whether this MPI is in
    :data:`SLOWER_NON_BLOCKING`."""
    told = os.environ.get("COLLECTIVES_MPI_BLOCKING", "")
    if told in ("0", "1"):
        return told == "1"
    return MPI.get_vendor()[0] in SLOWER_NON_BLOCKING


def library_path() -> str | None:
    """The file of the libmpi that mpi4py loaded (Linux), or None."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rsplit(None, 1)[-1]
                if re.search(r"/libmpi(_[a-z]+)?\.so", path):  # not libmpifort, libmpicxx
                    return path
    except OSError:
        pass
    return None


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


class MpiPending(Pending):
    """One non-blocking MPI request; waiting polls it against the communicator's deadline.

    mpi4py requests do not keep their buffers alive, so the pending owns ``arrays``: the
    arguments handed to MPI, widened and staged copies included. While it is incomplete it
    also sits in its backend's ``in_flight``, so that a dropped ``Work`` cannot free them either.
    """

    def __init__(
        self,
        request: MPI.Request,
        arrays: Any = None,
        in_flight: set | None = None,
        finish: Callable[[], None] | None = None,
    ):
        self.request = request
        self.arrays = arrays
        self.in_flight = in_flight
        self.finish = finish
        self.done = False
        self.start = time.monotonic()
        if in_flight is not None:
            in_flight.add(self)

    def test(self) -> bool:
        if not self.done and self.request.Test():
            self._complete()
        return self.done

    def synchronize(self, comm: Any) -> None:
        if self.done:
            return
        test = self.request.Test
        polls = 0
        yielding = False
        while not test():  # busy, as MPI's own blocking wait polls, then yielding the core
            polls += 1
            if polls & 255 == 0:
                yielding = self._waited(comm)
            elif yielding:
                os.sched_yield()
        self._complete()

    wait = synchronize  # MPI has no stream to order: waiting is blocking

    def _complete(self) -> None:
        super()._complete()
        if self.in_flight is not None:
            self.in_flight.discard(self)


#: elements one MPI call is given: counts are C ints where MPI has no large-count calls
#: (Open MPI 5), so larger calls are made in parts (``MpiBackend._in_parts``, and for the
#: verbs that are not element-wise, :mod:`._mpi_parts`)
MAX_COUNT = 2**31 - 1


class _AllOf:
    """The request of a call made in parts: complete once every part is."""

    def __init__(self, parts: list[MpiPending]):
        self.parts = parts

    def Test(self) -> bool:  # noqa: N802 - as MPI.Request's
        return all([part.test() for part in self.parts])


#: calls whose communicator was closed or aborted before they completed: MPI may still read
#: and write their arrays, so they are kept here until a later look finds them complete
_ABANDONED: list[MpiPending] = []


def abandon(pendings: set) -> int:
    """Keep the arrays of ``pendings`` alive past their communicator, for as long as MPI runs
    them (their ``finish`` is never run: nobody waits for these results any more). Returns
    how many of them MPI has not finished."""
    _ABANDONED[:] = [p for p in _ABANDONED if not p.request.Test()]
    kept = [p for p in pendings if not p.done and not p.request.Test()]
    _ABANDONED.extend(kept)
    pendings.clear()
    return len(kept)


class MpiBackend:
    """Collectives over one mpi4py communicator."""

    name = "mpi"

    def __init__(
        self, mpi_comm: MPI.Comm, cuda_aware: bool | None = None, blocking: bool | None = None
    ):
        self.comm = mpi_comm
        self.size = mpi_comm.Get_size()
        self.rank = mpi_comm.Get_rank()
        self.cuda_aware = mpi_cuda_aware() if cuda_aware is None else cuda_aware
        #: synchronous direct-path calls as blocking MPI calls (see ``init(mpi_blocking=)``)
        self.blocking = blocking_by_default() if blocking is None else blocking
        self.in_flight: set[MpiPending] = set()
        self._reap_at = _REAP_AT
        #: calls were left in flight at a close or abort: the MPI communicator is not freed
        self.unfinished = False

    # Each verb: (x, out, name, op, root) -> MpiPending.

    def all_reduce(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> MpiPending:
        if name in UPCAST:
            return self._via_float32(self.all_reduce, x, out, name, op, root)
        if x.size > MAX_COUNT:
            return self._in_parts(self.all_reduce, x, out, name, op, root)
        t = MPI_TYPE[name]
        send = MPI.IN_PLACE if out is x else [x, t]
        return self._post(self.comm.Iallreduce, send, [out, t], MPI_OP[op], then=self._avg(op, out))

    def reduce(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> MpiPending:
        if name in UPCAST:
            return self._via_float32(self.reduce, x, out, name, op, root)
        if x.size > MAX_COUNT:
            return self._in_parts(self.reduce, x, out, name, op, root)
        t = MPI_TYPE[name]
        if self.rank != root:
            return self._post(self.comm.Ireduce, [x, t], None, MPI_OP[op], root)
        send = MPI.IN_PLACE if out is x else [x, t]
        return self._post(
            self.comm.Ireduce, send, [out, t], MPI_OP[op], root, then=self._avg(op, out)
        )

    def broadcast(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> MpiPending:
        if x.size > MAX_COUNT:
            return self._in_parts(self.broadcast, x, out, name, op, root)
        return self._post(self.comm.Ibcast, [x, MPI_TYPE[name]], root)

    def all_gather(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> MpiPending:
        in_place = is_slot(x, out, self.rank)
        if x.size > MAX_COUNT:
            return self._whole(_mpi_parts.all_gather(self, x, out, name, in_place), x, out)
        t = MPI_TYPE[name]
        send = MPI.IN_PLACE if in_place else [x, t]
        return self._post(self.comm.Iallgather, send, [out, t])

    def reduce_scatter(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> MpiPending:
        if name in UPCAST:
            return self._via_float32(self.reduce_scatter, x, out, name, op, root)
        if is_slot(out, x, self.rank):
            # MPI's in-place form leaves the result in x[0], not x[rank]: go through a copy.
            result = array_module(out).empty_like(out)
            pending = self.reduce_scatter(x, result, name, op, root)
            pending.finish = _chain(pending.finish, lambda: _copy(out, result))
            return pending
        if out.size > MAX_COUNT:
            return self._whole(_mpi_parts.reduce_scatter(self, x, out, name, op), x, out)
        t = MPI_TYPE[name]
        return self._post(
            self.comm.Ireduce_scatter_block, [x, t], [out, t], MPI_OP[op], then=self._avg(op, out)
        )

    def all_to_all(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> MpiPending:
        if x.size // self.size > MAX_COUNT:
            return self._whole(_mpi_parts.all_to_all(self, x, out, name, MAX_COUNT), x, out)
        t = MPI_TYPE[name]
        send = MPI.IN_PLACE if out is x else [x, t]
        return self._post(self.comm.Ialltoall, send, [out, t])

    def gather(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> MpiPending:
        if x.size > MAX_COUNT:
            in_place = is_slot(x, out, self.rank)
            parts = _mpi_parts.gather(self, x, out, name, cast(int, root), in_place, MAX_COUNT)
            return self._whole(parts, x, out)
        t = MPI_TYPE[name]
        if self.rank != root:
            return self._post(self.comm.Igather, [x, t], None, root)
        send = MPI.IN_PLACE if is_slot(x, out, root) else [x, t]
        return self._post(self.comm.Igather, send, [out, t], root)

    def scatter(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> MpiPending:
        if out.size > MAX_COUNT:
            in_place = is_slot(out, x, self.rank)
            parts = _mpi_parts.scatter(self, x, out, name, cast(int, root), in_place, MAX_COUNT)
            return self._whole(parts, x, out)
        t = MPI_TYPE[name]
        if self.rank != root:
            return self._post(self.comm.Iscatter, None, [out, t], root)
        receive = MPI.IN_PLACE if is_slot(out, x, root) else [out, t]
        return self._post(self.comm.Iscatter, [x, t], receive, root)

    def send(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> MpiPending:
        if x.size > MAX_COUNT:
            peer = cast(int, root)
            return self._whole(_mpi_parts.sends(self, x, name, peer, _TAG, MAX_COUNT), x, None)
        return self._post(self.comm.Isend, [x, MPI_TYPE[name]], root, _TAG)

    def recv(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> MpiPending:
        if out.size > MAX_COUNT:
            peer = cast(int, root)
            return self._whole(_mpi_parts.recvs(self, out, name, peer, _TAG, MAX_COUNT), None, out)
        return self._post(self.comm.Irecv, [out, MPI_TYPE[name]], root, _TAG)

    def barrier(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> MpiPending:
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

    def _in_parts(
        self,
        verb: Callable[..., MpiPending],
        x: Any,
        out: Any,
        name: str,
        op: ReduceOp | None,
        root: int | None,
    ) -> MpiPending:
        """An element-wise call on more than ``MAX_COUNT`` elements, as one call per part of
        at most that many (in the same order on every rank), completing together."""
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
            parts.append(verb(part_x, part_out, name, op, root))
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
        self,
        verb: Callable[..., MpiPending],
        x: Any,
        out: Any,
        name: str,
        op: ReduceOp | None,
        root: int | None,
    ) -> MpiPending:
        wide_x = _decode(x, name)
        xp = array_module(wide_x)
        wide_out = (
            None if out is None else (wide_x if out is x else xp.empty(out.shape, xp.float32))
        )
        pending = verb(wide_x, wide_out, "float32", op, root)
        if out is not None:
            pending.finish = _chain(pending.finish, lambda: _encode(wide_out, out, name))
        return pending

    def staged(self, verb: Verb, x: Any, out: Any, name: Any, op: Any, root: Any) -> Pending:
        """Run ``verb`` on host copies of CuPy arrays, copying ``out`` back when done."""
        import cupy

        if self.cuda_aware:
            cupy.cuda.get_current_stream().synchronize()
            return verb(x, out, name, op, root)
        host_x = None if x is None else cupy.asnumpy(x)
        if out is None:
            host_out = None
        elif out is x:
            host_out = host_x
        else:
            host_out = np.empty(out.shape, out.dtype)
        pending = verb(host_x, host_out, name, op, root)
        if out is not None:
            pending.finish = _chain(pending.finish, lambda: out.set(host_out))
        return pending

    def needs_staging(self, x: Any, out: Any) -> bool:
        return is_device_array(x) or is_device_array(out)

    def group_start(self) -> None:
        pass

    def group_end(self, pendings: list) -> None:
        pass

    def split(self, child: MPI.Comm, color: int | None, key: int) -> tuple[Any, dict]:
        if child == MPI.COMM_NULL:
            return None, {}
        return MpiBackend(child, self.cuda_aware, self.blocking), {}

    def drain(self, comm: Any) -> None:
        """Finish the calls in flight before a close (under the timeout: a call that never
        completes is abandoned by the close instead)."""
        for pending in list(self.in_flight):
            try:
                pending.synchronize(comm)
            except CollectiveTimeoutError:
                return

    def close(self) -> None:
        self.abort()

    def abort(self) -> None:
        # What MPI has not finished keeps its arrays, and its communicator (see ``unfinished``).
        self.unfinished = abandon(self.in_flight) > 0 or self.unfinished
