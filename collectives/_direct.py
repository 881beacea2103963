"""The direct path: a synchronous ``all_reduce`` or ``broadcast`` of a NumPy array on the MPI
backend, from the argument checks to the completed call, for the calls that need least.

What :meth:`Communicator._run` does, in less: it keeps the same books (:mod:`._books`: the
thread token, numbering, check mode, progress board, flight recorder, whose entry is a list
here, not an object), then posts the non-blocking MPI call and polls it until it completes.
A call that lasts past ``yield_after`` is handed to the books' ``wait_long``, which waits on
it under the timeout. Anything unusual (another type, dtype, op or layout, a bad root,
another thread holding the communicator) returns ``NotImplemented`` before any bookkeeping,
and the general path runs the call or names the error. This is the per-call cost that small
messages see.

Two implementations with one interface, ``all_reduce(books, x, op, out)`` and
``broadcast(books, x, root)``: ``collectives/_fastmpi.c`` where it built for the MPI
library's ABI (MPICH's, or Open MPI's as ``_fastmpi_ompi``), this module's Python on mpi4py
otherwise (or with ``COLLECTIVES_PURE_PYTHON=1``). :func:`handle` gives MPI objects in the
form the chosen one takes.

On a communicator whose backend is ``blocking`` (``init(mpi_blocking=...)``; by default with
Open MPI and Intel MPI, whose non-blocking collectives are slower than their blocking ones)
both make the blocking MPI calls instead. A blocking call cannot be interrupted, so a stuck
one is ended by :data:`._watchdog.WATCHDOG`, which prints the timeout error and aborts the
job.

Example:
    >>> comm = col.init(backend="mpi")
    >>> _direct.all_reduce(comm._fast, np.ones(4), "sum", None)  # the array, reduced
"""

from __future__ import annotations

import ctypes
import os
from threading import get_ident
from time import monotonic
from typing import Any

import numpy as np
from mpi4py import MPI

from ._arrays import may_share_memory
from ._books import CallBooks
from ._mpi_base import FAST_OP_OBJECTS, FAST_TYPE_OBJECTS, library_path
from ._ops import ReduceOp

_IN_PLACE = MPI.IN_PLACE
_OP_TYPES = frozenset({str, ReduceOp})


def distinct_twin(out: Any, x: Any) -> bool:
    """True when ``out`` is a writeable NumPy array of ``x``'s dtype and shape, apart from it."""
    return (
        type(out) is np.ndarray
        and out.dtype is x.dtype
        and out.shape == x.shape
        and (flags := out.flags).c_contiguous
        and flags.writeable
        # two arrays that each own their memory are apart; otherwise compare extents
        and ((out.base is None and x.base is None) or not may_share_memory(x, out))
    )


#: elements above which the Python path leaves a call to the general one (``_mpi.MAX_COUNT``)
_LARGE = 2**31 - 1


def _all_reduce(books: CallBooks, x: Any, op: Any, out: Any) -> Any:
    if type(x) is not np.ndarray or type(op) not in _OP_TYPES:
        return NotImplemented
    types, ops = FAST_TYPE.get(x.dtype), FAST_OP.get(op)
    flags = x.flags
    if types is None or ops is None or not flags.c_contiguous or x.size > _LARGE:
        return NotImplemented  # (a count above what one call takes: the general path's parts)
    name, t = types
    source: Any
    if out is None or out is x:
        if not flags.writeable:
            return NotImplemented
        source, result = _IN_PLACE, x
    elif distinct_twin(out, x):
        source, result = [x, t], out
    else:
        return NotImplemented
    post = books.handle.Allreduce if books.blocking else books.handle.Iallreduce
    return _run(
        books, "all_reduce", x, name, ops[0], None, result, post, (source, [result, t], ops[1])
    )


def _broadcast(books: CallBooks, x: Any, root: Any) -> Any:
    if type(x) is not np.ndarray or type(root) is not int:
        return NotImplemented
    types = FAST_TYPE.get(x.dtype)
    flags = x.flags
    if types is None or not flags.c_contiguous or not 0 <= root < books.size or x.size > _LARGE:
        return NotImplemented
    if not flags.writeable and root != books.rank:  # the root only reads x
        return NotImplemented
    name, t = types
    post = books.handle.Bcast if books.blocking else books.handle.Ibcast
    return _run(books, "broadcast", x, name, None, root, x, post, ([x, t], root))


#: the code a blocking call posts on the board (``_progress.BLOCKING_CALLS``)
_CODE = {"all_reduce": 1, "broadcast": 2}


def _run(
    books: CallBooks,
    call: str,
    array: np.ndarray,
    name: str,
    op: ReduceOp | None,
    root: int | None,
    result: np.ndarray,
    post: Any,
    args: tuple,
) -> Any:
    """Steps 1 to 5 of :mod:`._books` for one call; ``_fastmpi.c``'s ``run`` is its C twin."""
    if get_ident() != books.owner:
        return NotImplemented  # not the owner thread's call: the general path refuses it
    token = books.token
    try:
        token.pop()
    except IndexError:
        return NotImplemented  # another thread's call: the general path says so
    try:
        seq = books.number(call, array, name, op, root)
        entry: list[Any] = [seq, call, array.shape, name, monotonic(), 0.0]
        recorder = books.recorder
        recorder.append(entry)
        blocking = books.blocking
        if blocking:
            # A blocking call cannot post anything once begun: the board says beforehand that
            # this rank is inside it, and 0 once it returns (``_progress.BLOCKING_CALLS``).
            inside = books.inside
            if inside is not None:
                inside[books.slot] = (seq - books.p2p) * 4 + _CODE[call]
            else:
                blocking = False
        try:
            request = post(*args)
        except BaseException:
            recorder.pop()  # posting failed: nothing is in flight to record
            raise
        finally:
            if blocking:
                inside[books.slot] = 0
        if request is None:  # a blocking call: done
            entry[5] = monotonic()
            return result
        test = request.Test
        start, yield_after = entry[4], books.yield_after
        polls = 0
        while not test():  # an error here leaves the entry: the call was posted
            polls += 1
            if polls & 255 == 0 and monotonic() - start > yield_after:
                books.wait_long(request, entry, args)
                break
        entry[5] = monotonic()
    finally:
        token.append(None)
    return result


#: MPI calls the C path takes, by ABI: (non-blocking all-reduce, broadcast, blocking ones, test)
_CALLS = {
    "mpich": ("MPI_Iallreduce_c", "MPI_Ibcast_c", "MPI_Allreduce_c", "MPI_Bcast_c", "MPI_Test"),
    "ompi": ("MPI_Iallreduce", "MPI_Ibcast", "MPI_Allreduce", "MPI_Bcast", "MPI_Test"),
}


def _abi() -> str | None:
    """ "mpich" (int handles, 64-bit MPI_Count), "ompi" (Open MPI's pointer handles), or None."""
    sizes = {MPI._sizeof(cls) for cls in (MPI.Comm, MPI.Datatype, MPI.Op, MPI.Request)}
    if sizes == {4} and MPI.COUNT.Get_size() == 8:
        return "mpich"
    if sizes == {ctypes.sizeof(ctypes.c_void_p)} and MPI.get_vendor()[0] == "Open MPI":
        return "ompi"
    return None


def _compiled() -> tuple[Any, str]:
    """(the C module and mpi4py's libmpi's call addresses, or None; why, in words)."""
    if os.environ.get("COLLECTIVES_PURE_PYTHON") == "1":
        return None, "in Python (COLLECTIVES_PURE_PYTHON=1)"
    abi, path = _abi(), library_path()
    if abi is None or path is None:
        vendor = MPI.get_vendor()[0]
        return None, f"in Python (the C path speaks the MPICH and Open MPI ABIs; this is {vendor})"
    try:
        if abi == "mpich":
            from . import _fastmpi as module  # type: ignore[attr-defined]
        else:
            from . import _fastmpi_ompi as module  # type: ignore[attr-defined]
    except ImportError:
        return None, f"in Python (the C extension for the {abi} ABI was not built)"
    if not hasattr(MPI.Request, "fromhandle"):
        return None, "in Python (the C path needs mpi4py >= 4)"
    try:
        lib = ctypes.CDLL(path)
        addresses = [ctypes.cast(getattr(lib, name), ctypes.c_void_p).value for name in _CALLS[abi]]
    except (OSError, AttributeError):
        return None, "in Python (this MPI lacks a call the C path makes)"
    return (module, addresses), f"in C ({module.__name__} on {os.path.basename(path)})"


_FAST, HOW = _compiled()
#: whether the compiled calls are in use
COMPILED = _FAST is not None


def handle(obj: Any) -> Any:
    """``obj`` (an MPI communicator, datatype or op) as the direct path takes it."""
    return MPI._handleof(obj) if COMPILED else obj


#: native-order dtype -> (name, MPI datatype)
FAST_TYPE = {dtype: (name, handle(t)) for dtype, (name, t) in FAST_TYPE_OBJECTS.items()}
#: the op as users pass it ("sum" or ReduceOp.SUM) -> (ReduceOp, MPI op)
FAST_OP = {key: (op, handle(mpi_op)) for key, (op, mpi_op) in FAST_OP_OBJECTS.items()}


def set_up(module: Any, addresses: list[int]) -> None:
    """Hand the C module the MPI calls at ``addresses`` (as :data:`_CALLS` lists them) and the
    objects it checks against."""
    module.setup(
        *addresses,
        int(_IN_PLACE),
        MPI.Exception,
        MPI.Request.fromhandle,
        np.ndarray,
        FAST_TYPE,
        FAST_OP,
        ReduceOp,
        CallBooks,
    )


if _FAST is not None:
    set_up(*_FAST)
    all_reduce = _FAST[0].all_reduce
    broadcast = _FAST[0].broadcast
else:
    all_reduce = _all_reduce
    broadcast = _broadcast
