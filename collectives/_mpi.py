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
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ._arrays import is_device_array, is_slot
from ._dtypes import COMPLEX, NAME_OF_CHAR
from ._ops import BY_NAME, ReduceOp
from ._work import Pending


def _mpi_type(name: str):
    return getattr(MPI, name, MPI.DATATYPE_NULL)


_HAS_FLOAT16 = _mpi_type("FLOAT16_T") != MPI.DATATYPE_NULL

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

#: ReduceOp -> MPI op (AVG is a sum divided afterwards)
MPI_OP = {
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


def divide_in_place(out: Any, size: int) -> None:
    """AVG's division; integers truncate toward zero, as NCCL's ncclAvg does."""
    if out.dtype.kind in "fc":
        out /= size
    else:
        # Floor division corrected toward zero (abs() would overflow the minimum integer).
        quotient = out // size
        quotient += ((out % size) != 0) & (out < 0)
        out[...] = quotient


def bfloat16_to_float32(bits: Any) -> Any:
    xp = np if isinstance(bits, np.ndarray) else __import__("cupy")
    wide = bits.astype(xp.uint32)
    wide <<= 16  # in place, so that a 0-d array stays an array (a writable buffer)
    return wide.view(xp.float32)


def float32_to_bfloat16(values: Any, out: Any) -> None:
    """Round float32 to bfloat16 bits (round to nearest even), written into uint16 ``out``."""
    xp = np if isinstance(values, np.ndarray) else __import__("cupy")
    b = values.view(xp.uint32).astype(xp.uint64)  # uint64: the rounding add cannot wrap
    rounded = ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(xp.uint16)
    # NaNs stay (quiet) NaNs: rounding would carry their payload into the exponent.
    quiet_nan = ((b >> 16) | 0x0040).astype(xp.uint16)
    out[...] = xp.where(values != values, quiet_nan, rounded)


def _decode(x: Any, name: str) -> Any:
    return bfloat16_to_float32(x) if name == "bfloat16" else x.astype(np.float32)


def _encode(values: Any, out: Any, name: str) -> None:
    if name == "bfloat16":
        float32_to_bfloat16(values, out)
    else:
        out[...] = values


def _chain(first: Callable[[], None] | None, then: Callable[[], None]) -> Callable[[], None]:
    if first is None:
        return then

    def both() -> None:
        first()
        then()

    return both


class MpiPending(Pending):
    """One non-blocking MPI request; waiting polls it against the communicator's deadline."""

    arrays: Any = None  # what MPI reads and writes, held where the request does not hold it

    def __init__(self, request: MPI.Request, finish=None):
        self.request = request
        self.finish = finish
        self.done = False
        self.start = time.monotonic()

    def test(self) -> bool:
        if not self.done and self.request.Test():
            self._complete()
        return self.done

    def synchronize(self, comm: Any) -> None:
        if self.done:
            return
        test = self.request.Test
        polls = 0
        while not test():  # busy, as MPI's own blocking wait polls
            polls += 1
            if polls & 255 == 0:
                self._waited(comm)
        self._complete()

    wait = synchronize  # MPI has no stream to order: waiting is blocking


class MpiBackend:
    """Collectives over one mpi4py communicator."""

    name = "mpi"

    def __init__(self, mpi_comm: MPI.Comm, cuda_aware: bool | None = None):
        self.comm = mpi_comm
        self.size = mpi_comm.Get_size()
        self.rank = mpi_comm.Get_rank()
        self.cuda_aware = mpi_cuda_aware() if cuda_aware is None else cuda_aware

    # Each verb: (x, out, name, op, root) -> MpiPending.

    def all_reduce(self, x, out, name, op, root):
        if name in UPCAST:
            return self._via_float32(self.all_reduce, x, out, name, op, root)
        t = MPI_TYPE[name]
        if out is x:
            request = self.comm.Iallreduce(MPI.IN_PLACE, [x, t], MPI_OP[op])
        else:
            request = self.comm.Iallreduce([x, t], [out, t], MPI_OP[op])
        return MpiPending(request, None if op != 4 else self._avg(op, out))  # 4: AVG

    def reduce(self, x, out, name, op, root):
        if name in UPCAST:
            return self._via_float32(self.reduce, x, out, name, op, root)
        t = MPI_TYPE[name]
        if self.rank != root:
            request = self.comm.Ireduce([x, t], None, MPI_OP[op], root)
            return MpiPending(request)
        send = MPI.IN_PLACE if out is x else [x, t]
        request = self.comm.Ireduce(send, [out, t], MPI_OP[op], root)
        return MpiPending(request, self._avg(op, out))

    def broadcast(self, x, out, name, op, root):
        return MpiPending(self.comm.Ibcast([x, MPI_TYPE[name]], root))

    def all_gather(self, x, out, name, op, root):
        t = MPI_TYPE[name]
        send = MPI.IN_PLACE if is_slot(x, out, self.rank) else [x, t]
        return MpiPending(self.comm.Iallgather(send, [out, t]))

    def reduce_scatter(self, x, out, name, op, root):
        if name in UPCAST:
            return self._via_float32(self.reduce_scatter, x, out, name, op, root)
        if is_slot(out, x, self.rank):
            # MPI's in-place form leaves the result in x[0], not x[rank]: go through a copy.
            result = np.empty_like(out)
            pending = self.reduce_scatter(x, result, name, op, root)
            pending.finish = _chain(pending.finish, lambda: np.copyto(out, result))
            return pending
        t = MPI_TYPE[name]
        request = self.comm.Ireduce_scatter_block([x, t], [out, t], MPI_OP[op])
        return MpiPending(request, self._avg(op, out))

    def all_to_all(self, x, out, name, op, root):
        t = MPI_TYPE[name]
        send = MPI.IN_PLACE if out is x else [x, t]
        return MpiPending(self.comm.Ialltoall(send, [out, t]))

    def gather(self, x, out, name, op, root):
        t = MPI_TYPE[name]
        if self.rank != root:
            return MpiPending(self.comm.Igather([x, t], None, root))
        send = MPI.IN_PLACE if is_slot(x, out, root) else [x, t]
        return MpiPending(self.comm.Igather(send, [out, t], root))

    def scatter(self, x, out, name, op, root):
        t = MPI_TYPE[name]
        if self.rank != root:
            return MpiPending(self.comm.Iscatter(None, [out, t], root))
        if is_slot(out, x, root):
            return MpiPending(self.comm.Iscatter([x, t], MPI.IN_PLACE, root))
        return MpiPending(self.comm.Iscatter([x, t], [out, t], root))

    def send(self, x, out, name, op, root):
        return MpiPending(self.comm.Isend([x, MPI_TYPE[name]], root, _TAG))

    def recv(self, x, out, name, op, root):
        return MpiPending(self.comm.Irecv([out, MPI_TYPE[name]], root, _TAG))

    def barrier(self, x, out, name, op, root):
        return MpiPending(self.comm.Ibarrier())

    # Helpers shared by the verbs.

    def _avg(self, op: ReduceOp, out: Any):
        if op is not ReduceOp.AVG:
            return None
        size = self.size
        return lambda: divide_in_place(out, size)

    def _via_float32(self, verb, x, out, name, op, root):
        wide_x = _decode(x, name)
        wide_out = (
            None if out is None else (wide_x if out is x else np.empty(out.shape, np.float32))
        )
        pending = verb(wide_x, wide_out, "float32", op, root)
        if out is not None:
            pending.finish = _chain(pending.finish, lambda: _encode(wide_out, out, name))
        return pending

    def staged(self, verb, x, out, name, op, root):
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
        return MpiBackend(child, self.cuda_aware), {}

    def close(self) -> None:
        pass  # the Communicator frees the MPI communicator it shares with this backend

    def abort(self) -> None:
        pass  # pending requests are abandoned; MPI defers the free until they end
