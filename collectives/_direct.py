"""The direct path's MPI calls: start a non-blocking collective on host arrays and poll it.

Each call returns ``None`` once the collective has completed, or the ``MPI.Request`` still in
flight after ``yield_after`` seconds of polling (the caller then waits under its timeout).
Two implementations with one signature: the compiled ``_fastmpi`` where it built and the MPI
library speaks the MPICH ABI, this module's Python on mpi4py otherwise. Handles are what the
chosen one takes: :func:`handle` turns a communicator, datatype or op into it.

Example:
    >>> import numpy as np
    >>> from mpi4py import MPI
    >>> from collectives import _direct
    >>> x = np.ones(4)
    >>> args = (_direct.handle(MPI.DOUBLE), _direct.handle(MPI.SUM), 1e-2)
    >>> _direct.all_reduce(_direct.handle(MPI.COMM_SELF), None, x, *args)  # None: done
"""

from __future__ import annotations

import ctypes
import os
import re
from time import monotonic
from typing import Any, Optional

import numpy as np
from mpi4py import MPI

_IN_PLACE = MPI.IN_PLACE


def _poll(request: MPI.Request, yield_after: float) -> Optional[MPI.Request]:
    test = request.Test
    start = monotonic()
    polls = 0
    while not test():
        polls += 1
        if polls & 255 == 0 and monotonic() - start > yield_after:
            return request
    return None


def _all_reduce(
    comm: MPI.Comm,
    send: Any,
    recv: np.ndarray,
    datatype: MPI.Datatype,
    op: MPI.Op,
    yield_after: float,
) -> Optional[MPI.Request]:
    source = _IN_PLACE if send is None else [send, datatype]
    return _poll(comm.Iallreduce(source, [recv, datatype], op), yield_after)


def _broadcast(
    comm: MPI.Comm, buffer: np.ndarray, datatype: MPI.Datatype, root: int, yield_after: float
) -> Optional[MPI.Request]:
    return _poll(comm.Ibcast([buffer, datatype], root), yield_after)


def _library_path() -> Optional[str]:
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


def _compiled() -> Any:
    """``_fastmpi`` set up on mpi4py's libmpi, or None where that is not possible."""
    if os.environ.get("COLLECTIVES_PURE_PYTHON") == "1":
        return None
    try:
        from . import _fastmpi  # type: ignore[attr-defined]
    except ImportError:
        return None
    handle_sizes = {MPI._sizeof(cls) for cls in (MPI.Comm, MPI.Datatype, MPI.Op, MPI.Request)}
    path = _library_path()
    if handle_sizes != {4} or MPI.COUNT.Get_size() != 8 or path is None:
        return None  # not the MPICH ABI
    if not hasattr(MPI.Request, "fromhandle"):
        return None  # mpi4py < 4
    try:
        lib = ctypes.CDLL(path)
        iallreduce, ibcast, test = (
            ctypes.cast(getattr(lib, name), ctypes.c_void_p).value
            for name in ("MPI_Iallreduce_c", "MPI_Ibcast_c", "MPI_Test")
        )
    except (OSError, AttributeError):
        return None  # before MPI-4: no large-count calls
    _fastmpi.setup(iallreduce, ibcast, test, int(_IN_PLACE), MPI.Exception, MPI.Request.fromhandle)
    return _fastmpi


_FAST = _compiled()
#: whether the compiled calls are in use
COMPILED = _FAST is not None

if _FAST is not None:
    all_reduce = _FAST.all_reduce
    broadcast = _FAST.broadcast

    def handle(obj: Any) -> Any:
        return MPI._handleof(obj)

else:
    all_reduce = _all_reduce
    broadcast = _broadcast

    def handle(obj: Any) -> Any:
        return obj
