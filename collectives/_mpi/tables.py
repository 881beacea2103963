"""What the MPI backend (:mod:`collectives._mpi.backend`) stands on: the datatype and op tables, what this MPI
library can do, and the calls a closed communicator left in flight (:func:`abandon`). A call's
request in flight is a :class:`collectives._core.work.MpiPending`.
"""

from __future__ import annotations

import ctypes
import os
import re
import threading

import numpy as np
from mpi4py import MPI

from .._core.work import MpiPending
from .._ops import ReduceOp
from . import minmax as _minmax

#: the tag of send/recv
_TAG = 7071
#: the tag of a two-rank reduce_scatter's exchange (``MpiBackend._exchange``): apart from
#: send/recv's, so that it never matches a user's message in flight
EXCHANGE_TAG = 7073


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


#: dtype name -> MPI datatype that moves (and, unless in UPCAST, reduces) it; float16's is
#: set by :func:`mpi_tables`
MPI_TYPE = {
    "int8": MPI.INT8_T,
    "uint8": MPI.UINT8_T,
    "int32": MPI.INT32_T,
    "uint32": MPI.UINT32_T,
    "int64": MPI.INT64_T,
    "uint64": MPI.UINT64_T,
    "float32": MPI.FLOAT,
    "float64": MPI.DOUBLE,
    "bfloat16": MPI.UINT16_T,
    "complex64": MPI.C_FLOAT_COMPLEX,
    "complex128": MPI.C_DOUBLE_COMPLEX,
}

#: dtypes this MPI cannot reduce natively: reduced in float32, then rounded back (float16
#: joins where this MPI cannot sum it: :func:`mpi_tables`)
UPCAST: set[str] = {"bfloat16"}

#: ReduceOp -> MPI op (AVG is a sum divided afterwards); keyed for the verbs' ``op``, which
#: the front end has checked is a ReduceOp wherever the call reduces. Max and min are ours
#: (:mod:`collectives._mpi.minmax`, set by :func:`mpi_tables`): MPI's keep one operand or the other at a
#: NaN or at +0.0 against -0.0, which gave ranks different bits
MPI_OP: dict[ReduceOp | None, MPI.Op] = {
    ReduceOp.SUM: MPI.SUM,
    ReduceOp.PROD: MPI.PROD,
    ReduceOp.AVG: MPI.SUM,
}

_TABLES_LOCK = threading.Lock()


def mpi_tables() -> None:
    """Complete the tables above, once: for the first MPI backend (or ``init``), never at
    import, since whether this MPI sums float16 takes an MPI call and max and min are MPI ops
    (:func:`collectives._mpi.minmax.ops`). Every entry is in place before the done mark (max's op) is."""
    if ReduceOp.MAX in MPI_OP:
        return
    with _TABLES_LOCK:
        if ReduceOp.MAX in MPI_OP:
            return
        native = _reduces_float16()
        MPI_TYPE["float16"] = MPI.FLOAT16_T if native else MPI.UINT16_T
        if not native:
            UPCAST.add("float16")
        maximum, minimum = _minmax.ops()
        MPI_OP[ReduceOp.MIN] = minimum
        MPI_OP[ReduceOp.MAX] = maximum


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
#: benchmarks/results/cpu-2core-2026-11-23-three-mpis/), where synchronous calls are blocking ones unless told otherwise
SLOWER_NON_BLOCKING = frozenset({"Open MPI", "Intel MPI"})


def blocking_told() -> bool | None:
    """What ``COLLECTIVES_MPI_BLOCKING`` says (``1``: True, ``0``: False), else None."""
    told = os.environ.get("COLLECTIVES_MPI_BLOCKING", "")
    return told == "1" if told in ("0", "1") else None


def blocking_by_default() -> bool:
    """``COLLECTIVES_MPI_BLOCKING`` (``1``/``0``), else whether this MPI is in
    :data:`SLOWER_NON_BLOCKING`."""
    told = blocking_told()
    return MPI.get_vendor()[0] in SLOWER_NON_BLOCKING if told is None else told


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
