"""The direct path: every verb on NumPy arrays on the MPI backend, synchronous or not, from
the argument checks to the completed call (or its ``Work``), for the calls that need least.

Each verb is ``CallBooks.<verb>`` (``_callbooks_verbs.c``): it checks its arguments in C and
hands the call, as one MPI call of a kind (:data:`KINDS`) on buffers and handles, to the
books' ``run`` (``_callbooks_run.c``), which does in C what :meth:`Communicator._run` does,
with the same books: the thread token, numbering, check mode, progress board, a
flight-recorder :class:`~._books.Entry`; then two stateless primitives: ``post`` makes the
MPI call and gives its request, and ``poll`` tests that request, the GIL released, for up to
``yield_after``. A call that lasts longer is handed to the books' ``wait_long``, which waits
on it as a ``Pending`` under the timeout; a call made with ``async_op=True``, or inside
``comm.group()`` (which holds it until the block ends), gives a C ``Work``
(``_callbooks_work.c``) whose wait polls it the same way. The functions below are those
methods, named as the verbs.
Anything unusual (another type, dtype, op or layout, overlapping arrays, a bad root or peer,
a count above what one MPI call takes, another thread holding the communicator) returns
``NotImplemented`` before any bookkeeping, and the general path runs the call or names the
error. This is the per-call cost that small messages see.

The primitives have two implementations with one interface: ``collectives/_fastmpi.c`` where
it built for the MPI library's ABI (MPICH's, or Open MPI's as ``_fastmpi_ompi``; C functions
that the books call directly), and :func:`_py_post` / :func:`_py_poll` on mpi4py otherwise (or
with ``COLLECTIVES_PURE_PYTHON=1``; the books call them). :func:`handle` gives MPI objects
in the form the chosen one takes, :func:`request` turns what ``post`` gave into an mpi4py
request.

On a communicator whose backend is ``blocking`` (``init(mpi_blocking=...)``; by default with
Open MPI and Intel MPI, whose non-blocking collectives are slower than their blocking ones)
every synchronous collective and sendrecv (not send and recv: a rank may send before it
receives) is a blocking MPI call; MPI never matches a blocking collective with a non-blocking one, so every
rank must make the call alike, synchronous or not. A blocking call cannot be interrupted, so a stuck one is ended by :data:`._watchdog.WATCHDOG`, which prints the
timeout error and aborts the job. Unless told non-blocking (``mpi_blocking=False``), a small
synchronous collective may be a kept persistent request instead (``_callbooks_kept.c``, by
default on MPICH), which matches no other form either; it is polled, so a stuck one raises.

Example:
    >>> comm = col.init(backend="mpi")
    >>> _direct.gather(comm._books, np.ones(4), 0, None)  # the gathered array on rank 0
"""

from __future__ import annotations

import ctypes
import os
from os import sched_yield
from time import monotonic
from typing import Any

import numpy as np
from mpi4py import MPI

from . import _callbooks
from ._arrays import may_share_memory
from ._books import CallBooks
from ._mpi_base import (
    _TAG,
    EXCHANGE_TAG,
    FAST_OP_OBJECTS,
    FAST_TYPE_OBJECTS,
    YIELD_EVERY,
    library_path,
    mpi_tables,
)
from ._ops import ReduceOp

_IN_PLACE = MPI.IN_PLACE


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


#: the kinds of MPI call the primitives post (the order of ``_fastmpi.c``'s enum)
KINDS = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "gather",
    "scatter",
    "send",
    "recv",
    "barrier",
    "sendrecv",
)
(
    ALL_REDUCE,
    BROADCAST,
    REDUCE,
    ALL_GATHER,
    REDUCE_SCATTER,
    ALL_TO_ALL,
    GATHER,
    SCATTER,
    SEND,
    RECV,
    BARRIER,
    SENDRECV,
) = range(len(KINDS))


# ---------------------------------------------------------------- the primitives, on mpi4py


def _spec(array: Any, t: Any, none: Any) -> Any:
    return none if array is None else [array, t]


def _py_post(
    kind: int,
    blocking: bool,
    comm: Any,
    s: Any,
    r: Any,
    count: int,
    t: Any,
    op: Any,
    root: int,
    source: int = -1,
    counts: Any = None,
) -> Any:
    """The primitive ``post`` (``_primitives.h``) on mpi4py: the request, or None once a
    blocking call returned. ``root``: the root, or the peer (a sendrecv's destination);
    ``source``: a sendrecv's, or for a reduce_scatter 0 or more: two ranks' exchange (``s[root]``
    to ``root``, the peer's part of ours from ``source`` into ``r``; :data:`EXCHANGES`);
    ``counts``: None, or each rank's count of a reduce_scatter (int64 words):
    ``(I)reduce_scatter`` then."""
    b = blocking and kind != SEND and kind != RECV  # a send or a recv is never blocking
    if kind == ALL_REDUCE:
        return (comm.Allreduce if b else comm.Iallreduce)(_spec(s, t, _IN_PLACE), [r, t], op)
    if kind == BROADCAST:
        return (comm.Bcast if b else comm.Ibcast)([r, t], root)
    if kind == REDUCE:
        post = comm.Reduce if b else comm.Ireduce
        return post(_spec(s, t, _IN_PLACE), _spec(r, t, None), op, root)
    if kind == ALL_GATHER:
        return (comm.Allgather if b else comm.Iallgather)(_spec(s, t, _IN_PLACE), [r, t])
    if kind == REDUCE_SCATTER:  # r may be longer (the books' scratch of an in-place form)
        if source >= 0:
            post = comm.Sendrecv if b else comm.Isendrecv
            return post([s[root], t], root, EXCHANGE_TAG, [r, count, t], source, EXCHANGE_TAG)
        if counts is not None:
            post = comm.Reduce_scatter if b else comm.Ireduce_scatter
            return post([s, t], [r, count, t], memoryview(counts).cast("q").tolist(), op)
        post = comm.Reduce_scatter_block if b else comm.Ireduce_scatter_block
        return post([s, t], [r, count, t], op)
    if kind == ALL_TO_ALL:
        return (comm.Alltoall if b else comm.Ialltoall)(_spec(s, t, _IN_PLACE), [r, t])
    if kind == GATHER:
        post = comm.Gather if b else comm.Igather
        return post(_spec(s, t, _IN_PLACE), _spec(r, t, None), root)
    if kind == SCATTER:
        post = comm.Scatter if b else comm.Iscatter
        return post(_spec(s, t, None), _spec(r, t, _IN_PLACE), root)
    if kind == SEND:
        return comm.Isend([s, t], root, _TAG)
    if kind == RECV:
        return comm.Irecv([r, t], root, _TAG)
    if kind == SENDRECV:
        post = comm.Sendrecv if b else comm.Isendrecv
        return post([s, t], root, _TAG, [r, t], source, _TAG)
    return comm.Barrier() if b else comm.Ibarrier()


def _py_reduce_local(source: memoryview, target: memoryview, count: int, t: Any, op: Any) -> None:
    """The primitive ``reduce_local`` on mpi4py: ``target = source op target``."""
    op.Reduce_local([source, count, t], [target, count, t])


#: seconds of yielding polls before ``poll`` hands a call back to the caller's wait
HAND_BACK = 0.01


def _py_poll(request: Any, yield_after: float) -> bool:
    """The primitive ``poll`` on mpi4py: True once complete, False after ``yield_after`` s of
    busy polls and :data:`HAND_BACK` s more of polls that yield the core every
    :data:`YIELD_EVERY` tests (below 0: after one test)."""
    test = request.Test
    if yield_after < 0:
        return test()
    start = monotonic()
    polls = 0
    waited = 0.0
    while not test():  # an error here leaves the entry: the call was posted
        polls += 1
        if waited >= yield_after:  # from the first test where yield_after is 0
            if polls % YIELD_EVERY == 0:
                sched_yield()
                if (waited := monotonic() - start) > yield_after + HAND_BACK:
                    return False
        elif polls & 255 == 0:
            waited = monotonic() - start
    return True


# ---------------------------------------------------------------- the verbs, checked in C
#
# Each takes the communicator's books and a verb's arguments, and gives the result (its
# ``Work`` with ``async_op=True``), or NotImplemented: ``CallBooks.<verb>`` checks them and
# runs the call (``_callbooks.c``).


def all_reduce(books: CallBooks, x: Any, op: Any, out: Any, async_op: bool = False) -> Any:
    """``Communicator.all_reduce`` of a NumPy array, or NotImplemented."""
    return books.all_reduce(x, op, out, async_op)


def broadcast(books: CallBooks, x: Any, root: Any, async_op: bool = False) -> Any:
    """``Communicator.broadcast`` of a NumPy array, or NotImplemented."""
    return books.broadcast(x, root, async_op)


def reduce(books: CallBooks, x: Any, root: Any, op: Any, out: Any, async_op: bool = False) -> Any:
    """``Communicator.reduce`` of a NumPy array, or NotImplemented."""
    return books.reduce(x, root, op, out, async_op)


def all_gather(books: CallBooks, x: Any, out: Any, async_op: bool = False) -> Any:
    """``Communicator.all_gather`` of a NumPy array, or NotImplemented."""
    return books.all_gather(x, out, async_op)


def reduce_scatter(books: CallBooks, x: Any, op: Any, out: Any, async_op: bool = False) -> Any:
    """``Communicator.reduce_scatter`` of a NumPy array, or NotImplemented."""
    return books.reduce_scatter(x, op, out, async_op)


def all_to_all(books: CallBooks, x: Any, out: Any, async_op: bool = False) -> Any:
    """``Communicator.all_to_all`` of a NumPy array, or NotImplemented."""
    return books.all_to_all(x, out, async_op)


def gather(books: CallBooks, x: Any, root: Any, out: Any, async_op: bool = False) -> Any:
    """``Communicator.gather`` of a NumPy array, or NotImplemented."""
    return books.gather(x, root, out, async_op)


def scatter(books: CallBooks, x: Any, root: Any, out: Any, async_op: bool = False) -> Any:
    """``Communicator.scatter`` of NumPy arrays, or NotImplemented."""
    return books.scatter(x, root, out, async_op)


def send(books: CallBooks, x: Any, peer: Any, async_op: bool = False) -> Any:
    """``Communicator.send`` of a NumPy array, or NotImplemented."""
    return books.send(x, peer, async_op)


def recv(books: CallBooks, x: Any, peer: Any, async_op: bool = False) -> Any:
    """``Communicator.recv`` into a NumPy array, or NotImplemented."""
    return books.recv(x, peer, async_op)


def sendrecv(
    books: CallBooks, x: Any, peer: Any, out: Any, source: Any, async_op: bool = False
) -> Any:
    """``Communicator.sendrecv`` of NumPy arrays, or NotImplemented."""
    return books.sendrecv(x, peer, out, source, async_op)


def barrier(books: CallBooks, async_op: bool = False) -> Any:
    """``Communicator.barrier``, or NotImplemented."""
    return books.barrier(async_op)


#: MPI calls the C primitives make, by ABI: the non-blocking call of each kind (as KINDS),
#: then the blocking call of each kind, then the reduce_scatter with counts (non-blocking,
#: blocking), then MPI_Test, then the persistent call of each kind ("": none), MPI_Start,
#: MPI_Request_free and MPI_Reduce_local;
#: Open MPI 5 has no large-count (``_c``) calls; an MPI before 4.0 has no sendrecv's and no
#: persistent calls (:data:`_OPTIONAL`)
_MPICH_CALLS = (
    "MPI_Iallreduce_c",
    "MPI_Ibcast_c",
    "MPI_Ireduce_c",
    "MPI_Iallgather_c",
    "MPI_Ireduce_scatter_block_c",
    "MPI_Ialltoall_c",
    "MPI_Igather_c",
    "MPI_Iscatter_c",
    "MPI_Isend_c",
    "MPI_Irecv_c",
    "MPI_Ibarrier",
    "MPI_Isendrecv_c",
    "MPI_Allreduce_c",
    "MPI_Bcast_c",
    "MPI_Reduce_c",
    "MPI_Allgather_c",
    "MPI_Reduce_scatter_block_c",
    "MPI_Alltoall_c",
    "MPI_Gather_c",
    "MPI_Scatter_c",
    "MPI_Send_c",
    "MPI_Recv_c",
    "MPI_Barrier",
    "MPI_Sendrecv_c",
    "MPI_Ireduce_scatter_c",
    "MPI_Reduce_scatter_c",
    "MPI_Test",
    "MPI_Allreduce_init_c",
    "MPI_Bcast_init_c",
    "MPI_Reduce_init_c",
    "MPI_Allgather_init_c",
    "MPI_Reduce_scatter_block_init_c",
    "MPI_Alltoall_init_c",
    "MPI_Gather_init_c",
    "MPI_Scatter_init_c",
    "",
    "",
    "MPI_Barrier_init",
    "",
    "MPI_Start",
    "MPI_Request_free",
    "MPI_Reduce_local_c",
)
_CALLS = {
    "mpich": _MPICH_CALLS,
    "ompi": tuple(name[:-2] if name.endswith("_c") else name for name in _MPICH_CALLS),
}
#: the calls an MPI before 4.0 lacks: a sendrecv is then not the direct path's, and no call
#: is a persistent request
_OPTIONAL = frozenset(
    {"MPI_Isendrecv", "MPI_Isendrecv_c", "MPI_Sendrecv", "MPI_Sendrecv_c"}
    | {"MPI_Reduce_local", "MPI_Reduce_local_c"}
    | {name for names in (_MPICH_CALLS, _CALLS["ompi"]) for name in names if "_init" in name}
)


def _address(lib: Any, name: str) -> int:
    """The address of ``name`` in ``lib``; 0 for "" and a missing call of :data:`_OPTIONAL`."""
    if not name or (name in _OPTIONAL and not hasattr(lib, name)):
        return 0
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0


def _abi() -> str | None:
    """ "mpich" (int handles, 64-bit MPI_Count), "ompi" (Open MPI's pointer handles), or None."""
    sizes = {MPI._sizeof(cls) for cls in (MPI.Comm, MPI.Datatype, MPI.Op, MPI.Request)}
    if sizes == {4} and MPI.COUNT.Get_size() == 8:
        return "mpich"
    if sizes == {ctypes.sizeof(ctypes.c_void_p)} and MPI.get_vendor()[0] == "Open MPI":
        return "ompi"
    return None


#: how calls run where the C primitives do not: the books and checks in C, the MPI calls
#: made by mpi4py (``_py_post``, ``_py_poll``)
_ON_MPI4PY = "in C, the MPI calls through mpi4py"


def _compiled() -> tuple[Any, str]:
    """(the C module and mpi4py's libmpi's call addresses, or None; why, in words)."""
    if os.environ.get("COLLECTIVES_PURE_PYTHON") == "1":
        return None, f"{_ON_MPI4PY} (COLLECTIVES_PURE_PYTHON=1)"
    abi, path = _abi(), library_path()
    if abi is None or path is None:
        vendor = MPI.get_vendor()[0]
        return (
            None,
            f"{_ON_MPI4PY} (the C path speaks the MPICH and Open MPI ABIs; this is {vendor})",
        )
    try:
        if abi == "mpich":
            from . import _fastmpi as module  # type: ignore[attr-defined]
        else:
            from . import _fastmpi_ompi as module  # type: ignore[attr-defined]
    except ImportError:
        return None, f"{_ON_MPI4PY} (the C extension for the {abi} ABI was not built)"
    if not hasattr(MPI.Request, "fromhandle"):
        return None, f"{_ON_MPI4PY} (the C primitives need mpi4py >= 4)"
    try:
        lib = ctypes.CDLL(path)
        addresses = [_address(lib, name) for name in _CALLS[abi]]
    except (OSError, AttributeError):
        return None, f"{_ON_MPI4PY} (this MPI lacks a call the C path makes)"
    return (module, addresses), f"in C ({module.__name__} on {os.path.basename(path)})"


_FAST, HOW = _compiled()
#: whether the compiled calls are in use
COMPILED = _FAST is not None


def handle(obj: Any) -> Any:
    """``obj`` (an MPI communicator, datatype or op) as the direct path takes it."""
    return MPI._handleof(obj) if COMPILED else obj


#: native-order dtype -> (name, MPI datatype); filled by :func:`fill_tables`
FAST_TYPE: dict = {}
#: the op as users pass it ("sum" or ReduceOp.SUM) -> (ReduceOp, MPI op); filled by
#: :func:`fill_tables`
FAST_OP: dict = {}


def fill_tables() -> None:
    """Fill :data:`FAST_TYPE` and :data:`FAST_OP` (in place: the C module holds them) from
    ``_mpi_base.mpi_tables()``: by the first MPI backend, not at import (they take MPI calls)."""
    mpi_tables()
    FAST_TYPE.update((dtype, (name, handle(t))) for dtype, (name, t) in FAST_TYPE_OBJECTS.items())
    FAST_OP.update((key, (op, handle(mpi_op))) for key, (op, mpi_op) in FAST_OP_OBJECTS.items())


def set_up(module: Any, addresses: list[int]) -> None:
    """Hand the C module the MPI calls at ``addresses`` (as :data:`_CALLS` lists them)."""
    info_null = MPI._handleof(MPI.INFO_NULL) & (2**64 - 1)
    module.setup(list(addresses), int(_IN_PLACE), _TAG, info_null, EXCHANGE_TAG)


def _c_request(given: Any) -> MPI.Request:
    """The mpi4py request of a handle that the C ``post`` gave."""
    return MPI.Request.fromhandle(given)


def _py_request(given: Any) -> MPI.Request:
    """The mpi4py request that ``_py_post`` gave."""
    return given


if _FAST is not None:
    set_up(*_FAST)
    request = _c_request
else:
    request = _py_request


def _mpi_has_isendrecv() -> bool:
    """Whether this MPI has ``MPI_Isendrecv`` (MPI 4.0, with ``MPI_Sendrecv``) and mpi4py
    calls it."""
    if not hasattr(MPI.Comm, "Isendrecv"):
        return False
    if _FAST is not None:
        return bool(_FAST[1][SENDRECV] and _FAST[1][len(KINDS) + SENDRECV])
    path = library_path()
    try:
        return path is not None and hasattr(ctypes.CDLL(path), "MPI_Isendrecv")
    except OSError:
        return False


#: whether a sendrecv is one MPI call (``MPI_Isendrecv``); without it, an ``MPI_Irecv`` and
#: an ``MPI_Isend`` that complete together (the general path)
SENDRECV_POSTED = _mpi_has_isendrecv()
#: which reduce_scatters are posted with each rank's count, by library (1 the non-blocking
#: ones, 2 the blocking ones): MPICH's ``MPI_Ireduce_scatter_block`` and Open MPI's
#: ``MPI_Reduce_scatter_block`` pick algorithms several times slower from 128 KiB than the
#: same libraries' ``MPI_(I)reduce_scatter`` (2 ranks, 15x and 6x at 1 MiB; benchmarks/
#: README.md, "Works in C"); elsewhere the two cost the same
COUNTED_REDUCE_SCATTER = {"MPICH": 1, "Open MPI": 2}.get(MPI.get_vendor()[0], 0)
#: bytes per rank from which they are (below, the two cost the same)
COUNTED_FROM = 64 << 10


def _exchanges() -> bool:
    """Whether a two-rank reduce_scatter may be an exchange: this MPI has ``MPI_Isendrecv``
    and ``MPI_Reduce_local`` where the C primitives call them."""
    if not SENDRECV_POSTED:
        return False
    return _FAST is None or bool(_FAST[1][-1])  # MPI_Reduce_local(_c), the last call


#: whether a reduce_scatter of two ranks is one exchange (each sends the part the other
#: keeps, then reduces what it got into its own with ``MPI_Reduce_local``), but for the sizes
#: kept as persistent requests (``kept_bytes``, where those are faster still): MPICH's, Open
#: MPI's and Intel MPI's own reduce_scatter took 1.1x to 7.9x its time from 16 KiB a call to
#: 16 MiB, 0.9x to 1.2x at 4 KiB, as long or longer below (benchmarks/README.md, "Two ranks'
#: reduce_scatter as one exchange"). The general path makes the same choice
#: (``MpiBackend.reduce_scatter``): ranks must meet in it whichever path each takes.
EXCHANGES = _exchanges()

_callbooks.use_primitives(
    None if _FAST is None else _FAST[0].primitives,
    _py_post,
    _py_poll,
    KINDS,
    np.ndarray,
    FAST_TYPE,
    FAST_OP,
    ReduceOp,
    np.empty,
    COUNTED_REDUCE_SCATTER,
    COUNTED_FROM,
    SENDRECV_POSTED,
    EXCHANGES,
    _py_reduce_local,
)
