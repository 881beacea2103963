"""The public ``Communicator``: argument checks, bookkeeping, and dispatch to a backend.

The verbs are thin: each checks its arguments locally (so bad input fails before any
communication), then ``_run`` keeps the books (:mod:`._books`) and hands the same
``(x, out, name, op, root)`` to the backend's verb of the same name. Every verb on NumPy
arrays on the MPI backend, synchronous or not, first tries the direct path
(:mod:`._direct`), which keeps the same books in less.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

import numpy as np
from mpi4py import MPI

from . import _direct, _exit, _timeline
from ._arrays import array_module, as_given, is_slot, overlap_check, same_kind, unwrap
from ._backend import Backend, Verb
from ._books import IN_USE, CallBooks, Entry
from ._direct import distinct_twin
from ._dtypes import COMPLEX, check_op_for_dtype
from ._errors import (
    CollectivesError,
    CollectiveTimeoutError,
    CommunicatorStateError,
    InvalidArgumentError,
)
from ._guard import Guard
from ._handshake import arrive
from ._mpi import MpiBackend, MpiPending
from ._ops import BY_NAME, ReduceOp, parse_op
from ._progress import ProgressBoard
from ._work import Pending, Work, recorded

RECORDER_LENGTH = 64
_get_ident = threading.get_ident
_HOST = frozenset({np.ndarray, type(None)})
_COUNT = [0]  # communicators made in this process: names their timeline tracks


class Communicator:
    """A group of ranks that run collectives together. Made by :func:`collectives.init`.

    Example:
        >>> comm = col.init()
        >>> x = np.full(4, comm.rank, np.float32)
        >>> comm.all_reduce(x)          # in place: every rank now holds sum(range(size))
        >>> comm.close()
    """

    def __init__(
        self,
        impl: Backend,
        mpi_comm: MPI.Comm,
        *,
        backend: str,
        timeout: float,
        check: bool,
        device: int | None = None,
        stream: Any = None,
    ):
        self._impl = impl
        self.mpi_comm = mpi_comm
        self.rank: int = mpi_comm.Get_rank()
        self.size: int = mpi_comm.Get_size()
        self._world_ranks = _world_ranks(mpi_comm, self.size)
        self._progress: ProgressBoard | None = ProgressBoard(mpi_comm)
        self.local_rank: int = self._progress.local_rank
        self.local_size: int = len(self._progress.members)
        # A waiting rank polls like MPI's own wait. When a node runs more ranks than it has
        # cores, the rank it waits for may need this core: then yield it after 100 us, not 10 ms
        # (small calls on 4 ranks over 2 cores measured 20x faster).
        yield_after = 1e-4 if self.local_size > _cores() else 1e-2
        self._books = books = CallBooks(
            self._progress.slots,
            self.local_rank,
            RECORDER_LENGTH,
            yield_after,
            self._mpi_wait,
            self.rank,
            self.size,
            self._progress.inside,
        )
        self.recorder = books.recorder
        books.owner = threading.get_ident()
        self.backend: str = backend
        self.device: int | None = device
        self.stream = stream
        self.timeout = float(timeout)
        self._group: list | None = None
        # One owner thread: a call from any other thread is refused on every rank alike (a
        # refusal decided by which thread got there first would differ between ranks, and
        # match one thread's call with another's).
        self._owner_thread = threading.current_thread()
        self._owner: int | None = self._owner_thread.ident
        self._unusable: CollectivesError | None = None
        self._failed = False  # declared failed, here or by another rank
        # The backend again where it is the MPI one, which stages device arrays through the host
        # and runs the direct path.
        self._mpi: MpiBackend | None = impl if isinstance(impl, MpiBackend) else None
        self._check_arrays = getattr(impl, "check_arrays", None)
        if hasattr(impl, "attach"):
            impl.attach(self)
        self._track = 0
        if _timeline.TIMELINE is not None:
            _COUNT[0] += 1
            self._track = _timeline.TIMELINE.track(
                f"communicator {_COUNT[0]} ({backend}, size {self.size})"
            )
        self._check_mode = bool(check)
        if self.size > 1 or check:  # see _guard: failure notices and scheduled checks
            books.checker = Guard(self, every_call=self._check_mode)
            books.quiet = self.timeout / 2
        # The books again where the direct path (_direct) applies (MPI, no timeline to draw);
        # _fast is them while it may be used: not inside group(), closed or dead.
        self._direct: CallBooks | None = None
        if self._mpi is not None and not self._track:
            books.handle, books.blocking = _direct.handle(self._mpi.comm), self._mpi.blocking
            books.later = self._mpi_later
            self._direct = books
        self._fast = self._direct
        if self._direct is not None and books.blocking:
            _direct.WATCHDOG.watch(self)  # a blocking call that outlasts the timeout ends the job

    @property
    def yield_after(self) -> float:
        """Seconds a waiting rank polls before it yields its core between polls."""
        return self._books.yield_after

    def __repr__(self) -> str:
        return (
            f"Communicator(backend={self.backend!r}, rank={self.rank}, size={self.size}, "
            f"device={self.device}, calls={self.call_path!r})"
        )

    @property
    def call_path(self) -> str:
        """Which per-call path runs here, and why, in one line.

        Example: ``comm.call_path`` -> ``"calls on NumPy arrays in C (collectives._fastmpi on
        libmpi.so.12); other calls through the MPI backend"``.
        """
        if self.backend != "mpi":
            return f"every call through the {self.backend} backend"
        if self._direct is None:
            return "every call through the MPI backend (a timeline records each call)"
        how = _direct.HOW
        if self._books.blocking:
            how += (
                ", synchronous all_reduce and broadcast as blocking MPI calls (a stuck one ends "
                "the job after the timeout)"
            )
        return f"calls on NumPy arrays {how}; other calls through the MPI backend"

    # ---------------------------------------------------------------- collectives

    def all_reduce(
        self, x: Any, op: ReduceOp | str = "sum", *, out: Any = None, async_op: bool = False
    ) -> Any:
        """Reduce ``x`` over all ranks into ``out`` (default: ``x``, in place).

        Example: ``comm.all_reduce(grad, op="avg")``.
        """
        fast = self._fast
        if fast is not None:  # it checks the owner thread (books.owner)
            try:
                result = _direct.all_reduce(fast, x, op, out, async_op)
            except MPI.Exception as e:
                self._mpi_error("all_reduce", e)
            if result is not NotImplemented:
                return result
        given = x, out
        x, name = unwrap(x, "all_reduce")
        rop = BY_NAME.get(op) if type(op) is str else None
        op = rop if rop is not None and name not in COMPLEX else self._op("all_reduce", op, name)
        out = x if out is None else self._out("all_reduce", out, x, name, x.shape)
        result = as_given(out, name, *given)
        return self._run(
            "all_reduce", self._impl.all_reduce, x, out, name, op, None, async_op, result
        )

    def reduce(
        self,
        x: Any,
        root: int = 0,
        op: ReduceOp | str = "sum",
        *,
        out: Any = None,
        async_op: bool = False,
    ) -> Any:
        """Reduce ``x`` over all ranks into ``out`` (default ``x``) on ``root`` only."""
        fast = self._fast
        if fast is not None:  # the direct path (:mod:`._direct`)
            try:
                result = _direct.reduce(fast, x, root, op, out, async_op)
            except MPI.Exception as e:
                self._mpi_error("reduce", e)
            if result is not NotImplemented:
                return result
        given = x, out
        x, name = unwrap(x, "reduce")
        self._root("reduce", root)
        op = self._op("reduce", op, name)
        if self.rank != root:
            if out is not None:
                self._out("reduce", out, x, name, x.shape)
            result = as_given(x, name, *given)
            return self._run("reduce", self._impl.reduce, x, None, name, op, root, async_op, result)
        out = x if out is None else self._out("reduce", out, x, name, x.shape)
        result = as_given(out, name, *given)
        return self._run("reduce", self._impl.reduce, x, out, name, op, root, async_op, result)

    def broadcast(self, x: Any, root: int = 0, *, async_op: bool = False) -> Any:
        """Make ``x`` on every rank equal to ``x`` on ``root`` (in place)."""
        fast = self._fast
        if fast is not None:  # it checks the owner thread (books.owner)
            try:
                result = _direct.broadcast(fast, x, root, async_op)
            except MPI.Exception as e:
                self._mpi_error("broadcast", e)
            if result is not NotImplemented:
                return result
        given = x
        x, name = unwrap(x, "broadcast")
        self._root("broadcast", root)
        out = x if self.rank != root else None  # the root's x is only read
        result = as_given(x, name, given)
        return self._run(
            "broadcast", self._impl.broadcast, x, out, name, None, root, async_op, result
        )

    def all_gather(self, x: Any, *, out: Any = None, async_op: bool = False) -> Any:
        """``out[r]`` is rank r's ``x``; ``out.shape == (size, *x.shape)``.

        ``x`` may be ``out[rank]`` itself (the in-place form).
        """
        fast = self._fast
        if fast is not None:  # the direct path (:mod:`._direct`)
            try:
                result = _direct.all_gather(fast, x, out, async_op)
            except MPI.Exception as e:
                self._mpi_error("all_gather", e)
            if result is not NotImplemented:
                return result
        given = x, out
        x, name = unwrap(x, "all_gather")
        shape = (self.size, *x.shape)
        out = (
            self._new(x, shape)
            if out is None
            else self._slot_out("all_gather", out, x, name, shape)
        )
        result = as_given(out, name, *given)
        return self._run(
            "all_gather", self._impl.all_gather, x, out, name, None, None, async_op, result
        )

    def reduce_scatter(
        self, x: Any, op: ReduceOp | str = "sum", *, out: Any = None, async_op: bool = False
    ) -> Any:
        """``out`` (shape ``x.shape[1:]``) is the reduction over ranks of ``x[rank]``."""
        fast = self._fast
        if fast is not None:  # the direct path (:mod:`._direct`)
            try:
                result = _direct.reduce_scatter(fast, x, op, out, async_op)
            except MPI.Exception as e:
                self._mpi_error("reduce_scatter", e)
            if result is not NotImplemented:
                return result
        given = x, out
        x, name = unwrap(x, "reduce_scatter")
        self._leading("reduce_scatter", x)
        op = self._op("reduce_scatter", op, name)
        shape = x.shape[1:]
        if out is None:
            out = self._new(x, shape)
        else:
            out = self._slot_out("reduce_scatter", out, x, name, shape, out_is_part=True)
        result = as_given(out, name, *given)
        return self._run(
            "reduce_scatter", self._impl.reduce_scatter, x, out, name, op, None, async_op, result
        )

    def all_to_all(self, x: Any, *, out: Any = None, async_op: bool = False) -> Any:
        """``out[j]`` is ``x[rank]`` of rank j; ``x.shape[0] == size``."""
        fast = self._fast
        if fast is not None:  # the direct path (:mod:`._direct`)
            try:
                result = _direct.all_to_all(fast, x, out, async_op)
            except MPI.Exception as e:
                self._mpi_error("all_to_all", e)
            if result is not NotImplemented:
                return result
        given = x, out
        x, name = unwrap(x, "all_to_all")
        self._leading("all_to_all", x)
        out = (
            self._new(x, x.shape) if out is None else self._out("all_to_all", out, x, name, x.shape)
        )
        result = as_given(out, name, *given)
        return self._run(
            "all_to_all", self._impl.all_to_all, x, out, name, None, None, async_op, result
        )

    def gather(self, x: Any, root: int = 0, *, out: Any = None, async_op: bool = False) -> Any:
        """On ``root``, ``out[r]`` is rank r's ``x`` (shape ``(size, *x.shape)``); None elsewhere."""
        fast = self._fast
        if fast is not None:  # the direct path (:mod:`._direct`)
            try:
                result = _direct.gather(fast, x, root, out, async_op)
            except MPI.Exception as e:
                self._mpi_error("gather", e)
            if result is not NotImplemented:
                return result
        given = x, out
        x, name = unwrap(x, "gather")
        self._root("gather", root)
        if self.rank != root:
            return self._run("gather", self._impl.gather, x, None, name, None, root, async_op, None)
        shape = (self.size, *x.shape)
        out = self._new(x, shape) if out is None else self._slot_out("gather", out, x, name, shape)
        result = as_given(out, name, *given)
        return self._run("gather", self._impl.gather, x, out, name, None, root, async_op, result)

    def scatter(
        self, x: Any = None, root: int = 0, *, out: Any = None, async_op: bool = False
    ) -> Any:
        """``out`` on rank r is ``x[r]`` of ``root``. Ranks other than root pass ``out``, or an
        ``x`` of root's shape (only its shape and dtype are used)."""
        fast = self._fast
        if fast is not None:  # the direct path (:mod:`._direct`)
            try:
                result = _direct.scatter(fast, x, root, out, async_op)
            except MPI.Exception as e:
                self._mpi_error("scatter", e)
            if result is not NotImplemented:
                return result
        self._root("scatter", root)
        given = x, out
        if x is not None:
            x, name = unwrap(x, "scatter")
            self._leading("scatter", x)
            if out is None:
                out = self._new(x, x.shape[1:])
            else:
                out = self._slot_out("scatter", out, x, name, x.shape[1:], out_is_part=True)
        elif self.rank == root:
            raise InvalidArgumentError("scatter: x is required on root, got None")
        elif out is None:
            raise InvalidArgumentError(
                "scatter: x is required on root; other ranks need out (or an x of root's shape), "
                "got x=None and out=None"
            )
        else:
            out, name = unwrap(out, "scatter", "out")
        send = x if self.rank == root else None
        result = as_given(out, name, *given)
        return self._run(
            "scatter", self._impl.scatter, send, out, name, None, root, async_op, result
        )

    def send(self, x: Any, peer: int, *, async_op: bool = False) -> Any:
        """Send ``x`` to ``peer`` (matched by a ``recv`` there, in the same order)."""
        fast = self._fast
        if fast is not None:  # the direct path (:mod:`._direct`)
            try:
                result = _direct.send(fast, x, peer, async_op)
            except MPI.Exception as e:
                self._mpi_error("send", e)
            if result is not NotImplemented:
                return result
        x, name = unwrap(x, "send")
        self._peer("send", peer)
        return self._run("send", self._impl.send, x, None, name, None, peer, async_op, None)

    def recv(self, x: Any, peer: int, *, async_op: bool = False) -> Any:
        """Receive into ``x`` from ``peer``."""
        fast = self._fast
        if fast is not None:  # the direct path (:mod:`._direct`)
            try:
                result = _direct.recv(fast, x, peer, async_op)
            except MPI.Exception as e:
                self._mpi_error("recv", e)
            if result is not NotImplemented:
                return result
        given = x
        x, name = unwrap(x, "recv")
        self._peer("recv", peer)
        result = as_given(x, name, given)
        return self._run("recv", self._impl.recv, None, x, name, None, peer, async_op, result)

    def barrier(self, *, async_op: bool = False) -> Any:
        """Return when every rank has called it."""
        fast = self._fast
        if fast is not None:  # the direct path (:mod:`._direct`)
            try:
                result = _direct.barrier(fast, async_op)
            except MPI.Exception as e:
                self._mpi_error("barrier", e)
            if result is not NotImplemented:
                return result
        return self._run(
            "barrier", self._impl.barrier, None, None, None, None, None, async_op, None
        )

    @contextmanager
    def group(self) -> Iterator[Communicator]:
        """Batch the calls inside into one launch; they complete when the block ends.

        Example (a ring exchange that cannot deadlock):
            >>> with comm.group():
            ...     comm.send(x, (comm.rank + 1) % comm.size)
            ...     comm.recv(y, (comm.rank - 1) % comm.size)
        """
        if self._group is not None:  # nested: join the outer group
            yield self
            return
        self._usable("group")
        self._own("group")
        # First: a group_start that raises must leave no group open on this communicator.
        self._impl.group_start()
        self._group = []
        self._books.grouped = True  # direct-path calls are held too (_mpi_later)
        failed = True
        try:
            yield self
            failed = False
        finally:
            pendings, self._group = self._group, None
            self._books.grouped = False
            if self._unusable is None:
                self._fast = self._direct
            self._impl.group_end(pendings)
            if not failed:
                for pending in pendings:
                    self._wait(pending)

    # ---------------------------------------------------------------- structure

    def split(self, color: int | None, key: int | None = None) -> Communicator | None:
        """A communicator of the ranks that passed the same ``color`` (None: not included).

        Every rank must call it. Ranks are ordered by ``key`` (default: current rank).
        """
        self._usable("split")
        self._own("split")
        if color is not None and (type(color) is not int or color < 0):
            raise InvalidArgumentError(
                f"split: color must be a non-negative int or None, got {color!r}"
            )
        if key is not None and (type(key) is not int or not -(2**31) <= key < 2**31):
            raise InvalidArgumentError(
                f"split: key must be an int in [-2**31, 2**31) or None, got {key!r}"
            )
        if color is not None and color >= 2**31:
            raise InvalidArgumentError(f"split: color must be below 2**31, got {color!r}")
        key = self.rank if key is None else key
        self._arrive("split")
        child = self.mpi_comm.Split(MPI.UNDEFINED if color is None else color, key)
        impl, extra = self._impl.split(child, color, key)
        if child == MPI.COMM_NULL:
            return None
        sub = Communicator(
            impl,
            child,
            backend=self.backend,
            timeout=self.timeout,
            check=self._check_mode,
            **extra,
        )
        # A part counts only its own ranks on the node; when the parent's ranks outnumber the
        # cores, a waiting rank of the part must yield its core as early as the parent's.
        sub._books.yield_after = min(sub._books.yield_after, self._books.yield_after)
        return sub

    def hand_over(self, thread: threading.Thread) -> None:
        """Make ``thread`` the only one that may issue calls on this communicator from now on.

        A communicator belongs to the thread that made it; a call from any other thread raises
        ``CommunicatorStateError`` (on every rank alike, before any communication). Only the
        owner may hand it over, between calls (async work it issued may still be waited on from
        any thread); every rank should hand it over at the same point of its program. Local:
        nothing is communicated.

        Example:
            >>> worker = threading.Thread(target=train, args=(comm,))
            >>> comm.hand_over(worker)     # before worker.start() is fine
            >>> worker.start()
        """
        if not isinstance(thread, threading.Thread):
            raise InvalidArgumentError(
                f"hand_over: thread must be a threading.Thread, got {type(thread).__name__}"
            )
        self._own("hand_over")
        if not self._books.token:
            raise CommunicatorStateError(f"hand_over: {IN_USE}")
        self._owner_thread, self._owner = thread, thread.ident
        self._books.owner = thread.ident or 0  # 0: learned at the thread's first call

    @property
    def owner(self) -> threading.Thread:
        """The thread that may issue calls on this communicator (see :meth:`hand_over`)."""
        return self._owner_thread

    def _own(self, call: str) -> None:
        """Raise ``CommunicatorStateError`` unless the calling thread owns the communicator."""
        ident = _get_ident()
        if ident == self._owner:
            return
        owner = self._owner_thread
        if self._owner is None and owner.ident == ident:  # handed over before it started
            self._owner = self._books.owner = ident
            return
        raise CommunicatorStateError(
            f"{call}: called from thread {threading.current_thread().name!r}, but the "
            f"communicator belongs to thread {owner.name!r} (the thread that made it, or that "
            "comm.hand_over() gave it to); every rank refuses such a call alike, so that no "
            "rank matches one thread's call with another thread's"
        )

    def close(self) -> None:
        """Free the communicator, once the calls in flight have finished (waiting at most the
        timeout for them). Idempotent; every rank should call it."""
        if isinstance(self._unusable, _Closed):
            return
        drain = getattr(self._impl, "drain", None)
        if drain is not None and self._unusable is None:
            drain(self)
        self._impl.close()  # first: a backend that refuses (NCCL inside a group) leaves it open
        self._unusable = _Closed("communicator is closed")
        self._fast = None
        self._free_mpi()

    def abort(self) -> None:
        """Tear the communicator down without waiting for operations in flight."""
        if isinstance(self._unusable, _Closed):
            return
        self._unusable = _Closed("communicator was aborted")
        self._fast = None
        self._impl.abort()
        self._free_mpi()

    def __enter__(self) -> Communicator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def xp(self) -> Any:
        """The array module of the backend: ``numpy`` for mpi, ``cupy`` for nccl (whose
        calls take device arrays only).

        Example:
            >>> buf = comm.xp.zeros(4, comm.xp.float32)   # an array this backend takes
        """
        if self.backend == "nccl":
            import cupy

            return cupy
        return np

    @property
    def closed(self) -> bool:
        return self._unusable is not None

    def mpi_comm_world_ranks(self) -> list[int]:
        """The ``MPI.COMM_WORLD`` ranks of this communicator's members, in rank order.
        Computed at creation: a watchdog thread reads it, and MPI may be called from
        other threads only under ``MPI_THREAD_MULTIPLE``."""
        return list(self._world_ranks)

    def _post_waiting(self, pending: Pending) -> Any:
        """Say on the progress board which call this rank waits in; the board, or None."""
        board = self._progress
        if board is not None:
            board.waiting(f"{pending.call} ({pending.detail})")
        return board

    def progress_report(self) -> str:
        """Which ranks have not reached this rank's latest call (those on this node)."""
        board = self._progress
        return "" if board is None else board.report()

    # ---------------------------------------------------------------- internals

    def _mpi_pending(self, request: Any, entry: Entry, args: tuple) -> MpiPending:
        """The pending of a direct-path call (:mod:`._direct`) that someone waits on, in its
        entry's place in the recorder. ``args`` holds the arrays, which MPI may still write
        after a timeout: the pending owns them, and the backend keeps them past an abort."""
        mpi = self._mpi
        assert mpi is not None  # the direct path runs on the MPI backend only
        if len(mpi.in_flight) >= mpi._reap_at:
            mpi._reap()
        pending = MpiPending(_direct.request(request), args, mpi.in_flight)
        pending.info = (entry.seq, entry.call, entry.shape, entry.dtype)
        pending.start = entry.start
        self.recorder[-1] = pending  # its state, "timed out" included, is the recorder's
        return pending

    def _mpi_later(
        self, request: Any, entry: Entry, args: tuple, result: Any, async_op: bool
    ) -> Any:
        """A direct-path call that completes later: made with ``async_op=True`` (its
        ``Work``), or inside :meth:`group` (held until the block ends)."""
        pending = self._mpi_pending(request, entry, args)
        group = self._group
        if group is not None:
            group.append(pending)
            if not async_op:
                return result
        return Work(self, pending, result)

    def _mpi_wait(self, request: Any, entry: Entry, args: tuple) -> None:
        """The rest of a long direct-path wait (:mod:`._direct`): yielding the core, under the
        timeout."""
        pending = self._mpi_pending(request, entry, args)
        try:
            pending._waited(self)  # yield now: this call has already polled for yield_after
            pending.synchronize(self)
        except CollectivesError as e:
            self._fatal(e)
            raise
        except MPI.Exception as e:
            self._mpi_error(pending.call, e)

    def _run(
        self,
        call: str,
        verb: Verb,
        x: Any,
        out: Any,
        name: str | None,
        op: ReduceOp | None,
        root: int | None,
        async_op: bool,
        result: Any,
    ) -> Any:
        if self._unusable is not None:
            raise self._unusable_error(call)
        if _get_ident() != self._owner:
            self._own(call)
        if self._check_arrays is not None:
            self._check_arrays(call, x, out)
        if type(out) is np.ndarray and not out.flags.writeable:
            what = "x" if out is x else "out"
            raise InvalidArgumentError(
                f"{call}: {what} is read-only, and {call} writes its result there"
            )
        books = self._books
        books.take(call)
        try:
            array = x if x is not None else out
            seq = books.number(call, array, name, op, root)
            stager = self._mpi
            pending: Pending
            if (
                stager is not None
                and "cupy" in sys.modules  # no CuPy imported: no device arrays to stage
                and (type(x) not in _HOST or type(out) not in _HOST)
                and stager.needs_staging(x, out)
            ):
                pending = stager.staged(verb, x, out, name, op, root)
            else:
                pending = verb(x, out, name, op, root)
            pending.info = (seq, call, None if array is None else array.shape, name)
            if self._track:
                pending.track = self._track
            self.recorder.append(pending)
            if self._group is not None:
                self._group.append(pending)
            elif not async_op:
                pending.wait(self)
                return result
            return Work(self, pending, result) if async_op else result
        except CollectivesError as e:
            self._fatal(e)
            raise
        except MPI.Exception as e:
            self._mpi_error(call, e)
        finally:
            books.token.append(None)

    def _wait(self, pending: Pending) -> None:
        try:
            pending.wait(self)
        except CollectivesError as e:
            self._fatal(e)
            raise
        except MPI.Exception as e:
            self._mpi_error(pending.call, e)

    def _synchronize(self, pending: Pending) -> None:
        try:
            pending.synchronize(self)
        except CollectivesError as e:
            self._fatal(e)
            raise
        except MPI.Exception as e:
            self._mpi_error(pending.call, e)

    def _fatal(self, error: CollectivesError) -> None:
        """A wait that timed out, or a backend that raises the error that ended it (and keeps
        it as ``failure``): from then on this communicator is dead too. Backends raise; only
        the front end declares the communicator dead."""
        if isinstance(error, CollectiveTimeoutError) or error is getattr(
            self._impl, "failure", None
        ):
            self._die(error)

    def _mpi_error(self, call: str, error: MPI.Exception) -> NoReturn:
        """An MPI error raised as a ``CollectivesError`` naming the call and the error; the
        communicator is dead (MPI leaves it in no known state), and the other ranks are told."""
        wrapped = CollectivesError(
            f"{call}: MPI error {error.Get_error_class()} on rank {self.rank}: "
            f"{error.Get_error_string().strip()}; the communicator is unusable"
        )
        wrapped.__cause__ = error
        self._die(wrapped)
        raise wrapped  # _die raised already; for the type checker

    def _arrive(self, call: str) -> None:
        """Before blocking MPI steps that every rank takes (making communicators): return
        once all ranks have arrived, or raise ``CollectiveTimeoutError`` naming those that did
        not, the communicator dead (:mod:`._handshake`)."""
        guard = self._books.checker
        try:  # on the guard's private communicator: no user message can match it
            if guard is None:
                arrive(self.mpi_comm, call, self.timeout)
            else:
                arrive(guard.notice.mpi, call, self.timeout, stamp=guard.notice.id)
        except CollectiveTimeoutError as e:
            self._die(e)

    def _check_peers(self, call: str) -> None:
        """Raise ``CommunicatorStateError`` (the communicator dead) if another rank declared
        it failed (:mod:`._guard`)."""
        guard = self._books.checker
        text = None if guard is None or self._unusable is not None else guard.failure()
        if text is not None:
            self._die(CommunicatorStateError(f"{call}: communicator is unusable: {text}"), False)

    def _die(self, error: CollectivesError, announce: bool = True) -> None:
        """Mark the communicator dead after a timeout, abort the backend, raise ``error``;
        tell the other ranks unless they told this one."""
        if self._unusable is None:
            self._unusable = error
            self._failed = True
            self._fast = None
            _exit.failed(error, self.timeout)
            guard = self._books.checker
            if announce and guard is not None:
                world = self._world_ranks[self.rank]
                guard.announce(f"rank {self.rank} (world rank {world}) declared it failed: {error}")
            self._dump_flight_record()
            self._impl.abort()
        raise error

    def flight_record(self) -> list[dict]:
        """The last calls on this communicator, oldest first (seq, call, bytes, state, timing)."""
        return [recorded(p).as_dict() for p in self.recorder]

    def _dump_flight_record(self) -> None:
        folder = os.environ.get("COLLECTIVES_FLIGHT_RECORDER")
        if folder:
            path = os.path.join(folder, f"flight-recorder.rank{MPI.COMM_WORLD.Get_rank()}.json")
            with open(path, "w") as f:
                json.dump(
                    {"rank": self.rank, "size": self.size, "calls": self.flight_record()},
                    f,
                    indent=1,
                    default=str,
                )

    def _unusable_error(self, call: str) -> CollectivesError:
        reason = self._unusable
        if isinstance(reason, _Closed):
            return CommunicatorStateError(f"{call}: {reason} (rank {self.rank})")
        return CommunicatorStateError(
            f"{call}: communicator is unusable after an earlier error: {reason}"
        )

    def _usable(self, call: str) -> None:
        if self._unusable is not None:
            raise self._unusable_error(call)

    def _free_mpi(self) -> None:
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        # A communicator with calls still in flight is left to MPI_Finalize: freeing it under
        # a pending collective crashes Open MPI when the request is next tested.
        if self.mpi_comm != MPI.COMM_NULL and not getattr(self._impl, "unfinished", False):
            self.mpi_comm.Free()
        if self._books.checker is not None:
            self._books.checker.close(failed=self._failed)

    def _op(self, call: str, op: Any, name: str) -> ReduceOp:
        op = parse_op(op, call)
        check_op_for_dtype(op, name, call)
        return op

    def _root(self, call: str, root: Any) -> None:
        if type(root) is not int or not 0 <= root < self.size:
            raise InvalidArgumentError(
                f"{call}: root must be an int in [0, {self.size}), got {root!r}"
            )

    def _peer(self, call: str, peer: Any) -> None:
        if type(peer) is not int or not 0 <= peer < self.size:
            raise InvalidArgumentError(
                f"{call}: peer must be an int in [0, {self.size}), got {peer!r}"
            )
        if peer == self.rank and self._group is None:
            raise InvalidArgumentError(
                f"{call}: peer {peer} is this rank: a {call} to itself outside "
                "comm.group() can never complete"
            )

    def _leading(self, call: str, x: Any) -> None:
        if x.ndim == 0 or x.shape[0] != self.size:
            raise InvalidArgumentError(
                f"{call}: x has shape {x.shape}, expected a first axis of size {self.size}"
            )

    def _new(self, x: Any, shape: tuple) -> Any:
        xp = array_module(x)
        if xp is np:
            return np.empty(shape, x.dtype)
        with x.device:  # on x's GPU, whichever is current
            return xp.empty(shape, x.dtype)

    def _out(self, call: str, out: Any, x: Any, name: str, shape: tuple) -> Any:
        if type(x) is np.ndarray and distinct_twin(out, x) and out.shape == shape:
            return out
        out, out_name = unwrap(out, call, "out")
        same_kind(call, x, name, out, out_name, shape)
        return x if overlap_check(call, x, out) else out

    def _slot_out(
        self, call: str, out: Any, x: Any, name: str, shape: tuple, out_is_part: bool = False
    ) -> Any:
        """``out`` for calls whose in-place form has one array be the rank's slot of the other."""
        out, out_name = unwrap(out, call, "out")
        same_kind(call, x, name, out, out_name, shape)
        part, whole = (out, x) if out_is_part else (x, out)
        if not is_slot(part, whole, self.rank):
            overlap_check(call, x, out)
        return out


def _world_ranks(mpi_comm: MPI.Comm, size: int) -> list[int]:
    """The ``MPI.COMM_WORLD`` ranks of ``mpi_comm``'s members, in rank order."""
    try:
        group, world = mpi_comm.Get_group(), MPI.COMM_WORLD.Get_group()
        try:
            return list(MPI.Group.Translate_ranks(group, list(range(size)), world))
        finally:
            group.Free()
            world.Free()
    except Exception:
        return list(range(size))


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class _Closed(CollectivesError):
    pass
