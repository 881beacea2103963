"""The public ``Communicator``: its verbs, bookkeeping, and dispatch to a backend.

The verbs are thin: each checks its arguments locally (:mod:`collectives._core.args`, so bad input fails
before any communication), then ``_run`` keeps the books (:mod:`collectives._core.books`) and runs the
backend's verb of the same name, bound to what it takes but its arrays (``verb(x, out)``,
which the MPI backend's stager may run on host copies). That is the one path of every call,
on every backend, synchronous or not: which MPI or NCCL call a rank makes never depends on
the Python type of the arrays it passes.

A communicator holds the objects of its other concerns and hands its public words on to
them: ``_life``, its :class:`~collectives._core.lifecycle.Lifecycle` (ownership, closing and
failure), and ``_groups``, its :class:`~collectives._core.grouping.Groups` (``comm.group()``
and the waits of held calls). The backend reaches the communicator only through the
:class:`~collectives._core.backend.BackendContext` it is given.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, NoReturn

import numpy as np
from mpi4py import MPI

from .. import _timeline
from .._arrays import as_given, unwrap
from .._errors import CollectivesError, InvalidArgumentError
from .._ops import ReduceOp
from .._safety import fork as _fork
from .._safety.guard import Guard
from .._safety.progress import INSIDE, ProgressBoard
from .args import (
    check_leading,
    check_peer,
    check_root,
    check_sendrecv_peers,
    check_split,
    check_writeable,
    checked_op,
    checked_out,
    checked_slot_out,
    new_like,
)
from .backend import Backend, BackendContext, Stager, Verb
from .books import CallBooks
from .grouping import Group, Groups
from .lifecycle import Lifecycle
from .work import COMPLETED, MpiPending, Pending, Work, recorded

RECORDER_LENGTH = 64
#: the calls whose arguments differ by role (root or not)
_ROOTED = frozenset(("reduce", "broadcast", "gather", "scatter"))
#: the types of the arrays a call may pass with nothing to stage through the host
_HOST = frozenset({np.ndarray, type(None)})
_get_ident = threading.get_ident
_COUNT = [0]  # communicators made in this process: names their timeline tracks


class Communicator:
    """A group of ranks that run collectives together. Made by :func:`collectives.init`.

    Example:
        >>> comm = col.init()
        >>> x = np.full(4, comm.rank, np.float32)
        >>> y = comm.all_reduce(x)      # in place: every rank now holds sum(range(size))
        >>> y is x, bool((x == sum(range(comm.size))).all())
        (True, True)
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
        board = ProgressBoard(mpi_comm)
        self.local_rank: int = board.local_rank
        self.local_size: int = len(board.members)
        # A waiting rank polls like MPI's own wait. When it shares its core with another rank
        # (_safety/progress.py, shares_a_core), the rank it waits for may need this core: then yield it
        # (every YIELD_EVERY tests) from the first test, not after 10 ms of polling.
        #: seconds a waiting rank polls before it yields its core between polls
        self.yield_after = 0.0 if board.shares_a_core else 1e-2
        self._books = books = CallBooks(  # this rank's number and inside words, by index
            board.words,
            board.first_word(self.local_rank),
            board.words[INSIDE:],
            RECORDER_LENGTH,
        )
        self.recorder = books.recorder
        self.backend: str = backend
        self.device: int | None = device
        self.stream = stream
        self._life = life = Lifecycle(
            mpi_comm, self.rank, self.size, float(timeout), impl, books, board
        )
        # What stages device arrays through the host (the MPI backend), or None.
        self._stager: Stager | None = impl.stager
        self._check_arrays = impl.check_arrays if impl.checks_arrays else None
        self._context = BackendContext(
            self, books, life.fatal, life.mpi_error, life.dump_flight_record
        )
        self._groups = Groups(life, impl, books, self._context)
        impl.attach(self._context)
        self._track = 0
        if _timeline.TIMELINE is not None:
            _COUNT[0] += 1
            self._track = _timeline.TIMELINE.track(
                f"communicator {_COUNT[0]} ({backend}, size {self.size})"
            )
        self._check_mode = bool(check)
        if self.size > 1 or check:  # see _safety/guard.py: failure notices and scheduled checks
            books.checker = Guard(
                self, self._check_mode, books, life.check_peers, life.fatal, MpiPending, board
            )
            books.quiet = self.timeout / 2
        _fork.watch(self)  # unusable in a forked child; told of at a rank's exit

    def __repr__(self) -> str:
        return (
            f"Communicator(backend={self.backend!r}, rank={self.rank}, size={self.size}, "
            f"device={self.device}, calls={self.call_path!r})"
        )

    @property
    def timeout(self) -> float:
        """Seconds after which a call that has not completed is declared hung. May be set
        (the same on every rank): later waits, and the backend's watchdog, follow it."""
        return self._life.timeout

    @timeout.setter
    def timeout(self, seconds: float) -> None:
        self._life.timeout = seconds

    @property
    def call_path(self) -> str:
        """Which calls this communicator makes, in one line: the same on every rank, for
        every array type.

        Example:
            >>> comm.call_path
            'non-blocking MPI calls, polled under the timeout'
        """
        return self._impl.call_form

    # ---------------------------------------------------------------- collectives

    def all_reduce(
        self, x: Any, op: ReduceOp | str = "sum", *, out: Any = None, async_op: bool = False
    ) -> Any:
        """Reduce ``x`` over all ranks into ``out`` (default: ``x``, in place).

        Example: ``comm.all_reduce(grad, op="avg")``.
        """
        given = x, out
        x, name = unwrap(x, "all_reduce")
        op = self._op("all_reduce", op, name)
        out = x if out is None else self._out("all_reduce", out, x, name, x.shape)
        result = out if name != "bfloat16" else as_given(out, name, *given)
        impl = self._impl
        return self._run(
            "all_reduce",
            lambda x, out: impl.all_reduce(x, out, name, op),
            x, out, name, op, None, async_op, result,
        )  # fmt: skip

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
        given = x, out
        x, name = unwrap(x, "reduce")
        root = self._root("reduce", root)
        op = self._op("reduce", op, name)
        if self.rank != root:
            if out is not None:
                self._role_checked(self._out, "reduce", out, x, name, x.shape)
            result = as_given(x, name, *given)
            verb = self._impl.reduce
            return self._run(
                "reduce",
                lambda x, out: verb(x, out, name, op, root),
                x, None, name, op, root, async_op, result,
            )  # fmt: skip
        if out is not None:
            out = self._role_checked(self._out, "reduce", out, x, name, x.shape)
        else:
            out = x
        result = as_given(out, name, *given)
        verb = self._impl.reduce
        return self._run(
            "reduce",
            lambda x, out: verb(x, out, name, op, root),
            x, out, name, op, root, async_op, result,
        )  # fmt: skip

    def broadcast(self, x: Any, root: int = 0, *, async_op: bool = False) -> Any:
        """Make ``x`` on every rank equal to ``x`` on ``root`` (in place)."""
        given = x
        x, name = unwrap(x, "broadcast")
        root = self._root("broadcast", root)
        out = x if self.rank != root else None  # the root's x is only read
        result = as_given(x, name, given)
        impl = self._impl
        return self._run(
            "broadcast",
            lambda x, out: impl.broadcast(x, name, root),
            x, out, name, None, root, async_op, result,
        )  # fmt: skip

    def all_gather(self, x: Any, *, out: Any = None, async_op: bool = False) -> Any:
        """``out[r]`` is rank r's ``x``; ``out.shape == (size, *x.shape)``.

        ``x`` may be ``out[rank]`` itself (the in-place form).
        """
        given = x, out
        x, name = unwrap(x, "all_gather")
        shape = (self.size, *x.shape)
        out = (
            self._new(x, shape)
            if out is None
            else self._slot_out("all_gather", out, x, name, shape)
        )
        result = as_given(out, name, *given)
        impl = self._impl
        return self._run(
            "all_gather",
            lambda x, out: impl.all_gather(x, out, name),
            x, out, name, None, None, async_op, result,
        )  # fmt: skip

    def reduce_scatter(
        self, x: Any, op: ReduceOp | str = "sum", *, out: Any = None, async_op: bool = False
    ) -> Any:
        """``out`` (shape ``x.shape[1:]``) is the reduction over ranks of ``x[rank]``."""
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
        impl = self._impl
        return self._run(
            "reduce_scatter",
            lambda x, out: impl.reduce_scatter(x, out, name, op),
            x, out, name, op, None, async_op, result,
        )  # fmt: skip

    def all_to_all(self, x: Any, *, out: Any = None, async_op: bool = False) -> Any:
        """``out[j]`` is ``x[rank]`` of rank j; ``x.shape[0] == size``."""
        given = x, out
        x, name = unwrap(x, "all_to_all")
        self._leading("all_to_all", x)
        out = (
            self._new(x, x.shape) if out is None else self._out("all_to_all", out, x, name, x.shape)
        )
        result = as_given(out, name, *given)
        impl = self._impl
        return self._run(
            "all_to_all",
            lambda x, out: impl.all_to_all(x, out, name),
            x, out, name, None, None, async_op, result,
        )  # fmt: skip

    def gather(self, x: Any, root: int = 0, *, out: Any = None, async_op: bool = False) -> Any:
        """On ``root``, ``out[r]`` is rank r's ``x`` (shape ``(size, *x.shape)``); None elsewhere."""
        given = x, out
        x, name = unwrap(x, "gather")
        root = self._root("gather", root)
        if self.rank != root:
            verb = self._impl.gather
            return self._run(
                "gather",
                lambda x, out: verb(x, out, name, root),
                x, None, name, None, root, async_op, None,
            )  # fmt: skip
        shape = (self.size, *x.shape)
        if out is None:
            out = self._new(x, shape)
        else:
            out = self._role_checked(self._slot_out, "gather", out, x, name, shape)
        result = as_given(out, name, *given)
        verb = self._impl.gather
        return self._run(
            "gather",
            lambda x, out: verb(x, out, name, root),
            x, out, name, None, root, async_op, result,
        )  # fmt: skip

    def scatter(
        self, x: Any = None, root: int = 0, *, out: Any = None, async_op: bool = False
    ) -> Any:
        """``out`` on rank r is ``x[r]`` of ``root``. Ranks other than root pass ``out``, or an
        ``x`` of root's shape (only its shape and dtype are used)."""
        root = self._root("scatter", root)
        given = x, out
        try:  # which arguments a rank passes depends on its role: see _role_checked
            send, out, name = self._scatter_args(x, root, out)
        except InvalidArgumentError as e:
            self._fail_one_sided(e)
        result = as_given(out, name, *given)
        impl = self._impl
        return self._run(
            "scatter",
            lambda x, out: impl.scatter(x, out, name, root),
            send, out, name, None, root, async_op, result,
        )  # fmt: skip

    def _scatter_args(self, x: Any, root: int, out: Any) -> tuple[Any, Any, str]:
        """scatter's (send buffer, out, dtype name), checked."""
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
        return (x if self.rank == root else None), out, name

    def send(self, x: Any, peer: int, *, async_op: bool = False) -> Any:
        """Send ``x`` to ``peer`` (matched by a ``recv`` there, in the same order)."""
        x, name = unwrap(x, "send")
        peer = self._peer("send", peer)
        if self._books.held is not None:
            self._apart_in_group("send", x, None)
        impl = self._impl
        return self._run(
            "send",
            lambda x, out: impl.send(x, name, peer),
            x, None, name, None, peer, async_op, None,
        )  # fmt: skip

    def recv(self, x: Any, peer: int, *, async_op: bool = False) -> Any:
        """Receive into ``x`` from ``peer``."""
        given = x
        x, name = unwrap(x, "recv")
        peer = self._peer("recv", peer)
        if self._books.held is not None:
            self._apart_in_group("recv", None, x)
        result = as_given(x, name, given)
        impl = self._impl
        return self._run(
            "recv",
            lambda x, out: impl.recv(out, name, peer),
            None, x, name, None, peer, async_op, result,
        )  # fmt: skip

    def sendrecv(
        self,
        x: Any,
        peer: int,
        *,
        out: Any = None,
        source: int | None = None,
        async_op: bool = False,
    ) -> Any:
        """Send ``x`` to ``peer`` and receive ``out`` (default: a new array like ``x``) from
        ``source`` (default: ``peer``), as one call that no order of ranks can deadlock.

        Example: ``left = comm.sendrecv(mine, (rank + 1) % size, source=(rank - 1) % size)``.
        """
        given = x, out
        x, name = unwrap(x, "sendrecv")
        source = peer if source is None else source
        peer, source = check_sendrecv_peers(
            peer, source, self.rank, self.size, self._books.held is not None
        )
        out = self._new(x, x.shape) if out is None else self._out("sendrecv", out, x, name, x.shape)
        if out is x:
            raise InvalidArgumentError("sendrecv: out is x; it needs two arrays (or out=None)")
        if self._books.held is not None:
            self._apart_in_group("sendrecv", x, out)
        impl = self._impl
        return self._run(
            "sendrecv",
            lambda x, out: impl.sendrecv(x, out, name, peer, source),
            x, out, name, None, peer, async_op, as_given(out, name, *given),
        )  # fmt: skip

    def barrier(self, *, async_op: bool = False) -> Any:
        """Return when every rank has called it."""
        impl = self._impl
        return self._run(
            "barrier",
            lambda x, out: impl.barrier(),
            None, None, None, None, None, async_op, None,
        )  # fmt: skip

    # ---------------------------------------------------------------- structure

    def split(self, color: int | None, key: int | None = None) -> Communicator | None:
        """A communicator of the ranks that passed the same ``color`` (None: not included).

        Every rank must call it. Ranks are ordered by ``key`` (default: current rank).
        """
        self._life.ensure_usable("split")
        self._life.own("split")
        color, key = check_split(color, key)
        key = self.rank if key is None else key
        self.arrive("split")
        child = self.mpi_comm.Split(MPI.UNDEFINED if color is None else color, key)
        impl, extra = self._impl.split(child, color, key)
        if child == MPI.COMM_NULL:
            return None
        assert impl is not None  # every backend makes one for each member
        sub = Communicator(
            impl, child, backend=self.backend, timeout=self.timeout, check=self._check_mode, **extra
        )
        # A part counts only its own ranks on the node; when the parent's ranks outnumber the
        # cores, a waiting rank of the part must yield its core as early as the parent's.
        sub.yield_after = min(sub.yield_after, self.yield_after)
        return sub

    def check_arrays(self, call: str, x: Any, out: Any) -> None:
        """Raise ``InvalidArgumentError`` naming ``call`` where the backend cannot take ``x``
        or ``out`` (NCCL: CuPy arrays on its device only) or ``out`` is a read-only NumPy
        array: the checks a call makes of its arrays, for views built on the communicator
        (:func:`collectives.hierarchical`). Local: nothing is communicated."""
        if self._check_arrays is not None:
            self._check_arrays(call, x, out)
        check_writeable(call, x, out)

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
        return self._impl.xp

    def group(self) -> Group:
        """Batch the calls inside into one launch; they complete when the block ends.

        A receive into memory that a send of the block reads (or the reverse) raises
        ``InvalidArgumentError`` and fails the communicator: undefined in MPI and NCCL.

        Example (a ring exchange that cannot deadlock):
            >>> with comm.group():
            ...     comm.send(x, (comm.rank + 1) % comm.size)
            ...     y = comm.recv(np.empty_like(x), (comm.rank - 1) % comm.size)
            >>> y                  # the previous rank's x (at one rank: its own)
            array([0., 1., 2., 3.], dtype=float32)
        """
        return Group(self._groups, self)

    # ------------------------------------------- ownership, closing, failure (self._life)

    def hand_over(self, thread: threading.Thread) -> None:
        """Make ``thread`` the only one that may issue calls on this communicator from now on.

        A communicator belongs to the thread that made it; a call from any other thread raises
        ``CommunicatorStateError`` (on every rank alike, before any communication). Only the
        owner may hand it over, between calls (async work it issued may still be waited on from
        any thread); every rank should hand it over at the same point of its program. Local:
        nothing is communicated.

        On NCCL the thread must make the communicator's GPU current before it makes arrays
        (CUDA's current device is per thread): :meth:`device_scope`.

        Example:
            >>> def train(comm):
            ...     with comm.device_scope():
            ...         comm.all_reduce(comm.xp.ones(4))
            >>> comm = col.init()
            >>> worker = threading.Thread(target=train, args=(comm,))
            >>> comm.hand_over(worker)     # before worker.start() is fine
            >>> comm.barrier()             # this thread's calls are refused from now on
            Traceback (most recent call last):
            collectives._errors.CommunicatorStateError: barrier: called from thread 'MainThread', but the communicator belongs to thread 'Thread-...' ...
            >>> worker.start()             # train starts with `with comm.device_scope():`
            >>> worker.join(); comm.close()
        """
        self._life.hand_over(thread)

    @property
    def owner(self) -> threading.Thread:
        """The thread that may issue calls on this communicator (see :meth:`hand_over`)."""
        return self._life.owner

    def device_scope(self) -> contextlib.AbstractContextManager:
        """Make the communicator's GPU the calling thread's current device for a with-block.

        CUDA's current device is per host thread and starts at 0 in every new thread, and
        CuPy allocates there: a thread handed a communicator on device 1 must make it current
        before it makes arrays, or its calls are refused ("x is on device 0, expected device
        1"). On the MPI backend (no device) it does nothing.

        Example:
            >>> def train(comm):
            ...     with comm.device_scope():   # first thing in the thread
            ...         x = comm.xp.ones(4)
            ...         comm.all_reduce(x)
            >>> comm = col.init()
            >>> worker = threading.Thread(target=train, args=(comm,))
            >>> comm.hand_over(worker)
            >>> worker.start()
            >>> worker.join(); comm.close()
        """
        if self.device is None:
            return contextlib.nullcontext()
        import cupy

        return cupy.cuda.Device(self.device)

    def close(self) -> None:
        """Free the communicator, once the calls in flight have finished (waiting at most the
        timeout for them). Idempotent; every rank should call it."""
        self._life.close()

    def abort(self) -> None:
        """Tear the communicator down without waiting for operations in flight."""
        self._life.abort()

    @property
    def closed(self) -> bool:
        return self._life.unusable is not None

    def ensure_usable(self, call: str) -> None:
        """Raise ``CommunicatorStateError`` naming ``call`` if the communicator is closed or
        dead (local: nothing is communicated)."""
        self._life.ensure_usable(call)

    def arrive(self, call: str) -> None:
        """Before blocking MPI steps that every rank takes (making communicators): return
        once all ranks have arrived, or raise ``CollectiveTimeoutError`` naming those that did
        not, the communicator dead (:mod:`collectives._safety.handshake`). Every rank calls it.

        Example:
            >>> comm.arrive("hierarchical")     # then split: no rank blocks in MPI for ever
        """
        self._life.arrive(call)

    def flight_record(self) -> list[dict]:
        """The last calls on this communicator, oldest first (seq, call, bytes, state, timing)."""
        return self._life.flight_record()

    def mpi_comm_world_ranks(self) -> list[int]:
        """The ``MPI.COMM_WORLD`` ranks of this communicator's members, in rank order.
        Computed at creation: a watchdog thread reads it, and MPI may be called from
        other threads only under ``MPI_THREAD_MULTIPLE``."""
        return list(self._life.world_ranks)

    # What the waits read (the Waiter protocol of collectives._core.backend), the safety
    # hooks call (collectives._safety: exit, fork) and the watchdog of blocking calls asks.

    def check_peers(self, call: str) -> None:
        """If another rank declared the communicator failed (:mod:`collectives._safety.guard`), raise the class
        of its error, naming it (``CollectiveTimeoutError`` for a timeout: one class per
        event, :mod:`._errors`), the communicator dead; a wait that lasts calls it."""
        self._life.check_peers(call)

    def peer_failure(self) -> tuple[type[CollectivesError], str] | None:
        """The class and text of another rank's failure notice, once one has arrived; None
        while none has (or where there are no notices). The watchdog of blocking calls asks
        from its own thread while this rank is inside a blocking MPI call."""
        return self._life.peer_failure()

    def declare_blocked(self, error: CollectivesError, told: str | None = None) -> None:
        """Declare the communicator failed, without raising, for a call stuck in a blocking
        MPI call (the watchdog's thread calls it, then ends the job): the other ranks told, or
        the notice that told this one (``told``) passed on with this node's view, and
        ``error`` naming the ranks that never arrived from every node's board."""
        self._life.declare(error, told)

    def post_waiting(self, pending: Pending) -> Any:
        """Say on the progress board which call this rank waits in (a wait that lasts calls
        it); the board, or None."""
        return self._life.post_waiting(pending)

    def progress_report(self) -> str:
        """Which ranks have not reached this rank's latest call (those on this node)."""
        return self._life.progress_report()

    def forked(self, parent: int) -> None:
        """In a child forked from process ``parent`` (:mod:`collectives._safety.fork`): unusable from now on,
        and closing it does nothing; no MPI call is made (MPI is the parent's)."""
        self._life.forked(parent)

    def leaving(self, how: str) -> None:
        """At exit, while other ranks have not all reached it (:mod:`collectives._safety.exit`): tell them that
        this rank left; their waits on this communicator then raise
        ``CommunicatorStateError`` naming it (a rank gone is the communicator's state).
        Local: one small message to each rank."""
        self._life.leaving(how)

    def stuck_past(self) -> str | None:
        """A rank of this node inside a blocking call for a collective that this rank, which
        is leaving, never made: it can neither complete nor see a notice (:mod:`collectives._safety.exit`)."""
        return self._life.stuck_past()

    # ---------------------------------------------------------------- internals

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
        """Run ``verb(x, out)`` (the backend's verb, bound to the rest of its arguments) with
        the books' steps around it; ``name``, ``op`` and ``root`` (the root or the peer) are
        what the books record and check mode compares."""
        if _get_ident() != self._life.admits:
            self._life.admit(call)
        try:
            if self._check_arrays is not None:
                self._check_arrays(call, x, out)
            if type(out) is np.ndarray and not out.flags.writeable:
                check_writeable(call, x, out)
        except InvalidArgumentError as e:
            if root is not None and call in _ROOTED:
                self._rooted_arrays_failed(call, x, e)
            raise
        books = self._books
        if books.busy:
            books.take(call)  # raises
        books.busy = True
        try:
            books.number(call, x if x is not None else out, name, op, root)
            if self._stager is None or (type(x) in _HOST and type(out) in _HOST):
                pending = verb(x, out)
            else:
                pending = self._stager.run(verb, x, out)
            if pending is COMPLETED:  # done where it was made: the recorder keeps the books
                books.recorder.append(books.current)
                if self._track and _timeline.TIMELINE is not None:
                    _timeline.TIMELINE.pending(recorded(books.current), self._track)
                return Work(self._context, None, result) if async_op else result
            pending.info = books.current
            if self._track:
                pending.track = self._track
            books.recorder.append(pending)
            held = books.held
            if held is not None:
                held.append(pending)
            elif not async_op:
                if not pending.done:
                    pending.wait_issued(self)
                return result
            return Work(self._context, pending, result) if async_op else result
        except CollectivesError as e:
            self._life.fatal(e)
            raise
        except MPI.Exception as e:
            self._life.mpi_error(call, e)
        finally:
            books.busy = False

    # The argument checks (:mod:`collectives._core.args`), with this communicator's rank and size.
    _op = staticmethod(checked_op)
    _new = staticmethod(new_like)
    _out = staticmethod(checked_out)

    def _role_checked(self, check: Any, call: str, *args: Any) -> Any:
        """``check(call, *args)``, a check of an argument that only ranks of one role (root,
        or not root) pass or use: where it fails, see :meth:`_fail_one_sided`."""
        try:
            return check(call, *args)
        except InvalidArgumentError as e:
            self._fail_one_sided(e)

    def _rooted_arrays_failed(self, call: str, x: Any, error: InvalidArgumentError) -> NoReturn:
        """The backend's and the writeability checks of a rooted call's arrays failed: the
        array every rank passes alike (x; none for scatter, whose arrays depend on the role)
        fails locally, by checking it again alone; any other failed by role."""
        if call != "scatter" and self._check_arrays is not None:
            self._check_arrays(call, x, None)
        self._fail_one_sided(error)

    def _apart_in_group(self, call: str, sent: Any, received: Any) -> None:
        """Inside ``comm.group()``: refuse a point-to-point call whose buffers meet the
        group's others as a send's and a receive's (:meth:`Groups.refuse_overlap`). The
        group's earlier calls were posted already, and a peer's may match them: the
        communicator fails, on every rank, as after a timeout (even alone: a message to
        itself stays posted)."""
        try:
            self._groups.refuse_overlap(call, sent, received)
        except InvalidArgumentError as error:
            if _get_ident() == self._life.admits:  # usable, and its owner's
                self._life.die(error)
            raise

    def _fail_one_sided(self, error: InvalidArgumentError) -> NoReturn:
        """An argument error that depends on this rank's role, so that the other ranks' call
        goes on: the communicator fails on every rank, as after a timeout (this rank raises
        ``error``; the others the same class naming it at their current wait or next call).
        Local only in a world of one, or on another thread (refused alike)."""
        if self.size > 1 and _get_ident() == self._life.admits:  # usable, and its owner's
            self._life.die(error)
        raise error

    def _root(self, call: str, root: Any) -> int:
        return check_root(call, root, self.size)

    def _peer(self, call: str, peer: Any) -> int:
        return check_peer(call, peer, self.rank, self.size, self._books.held is not None)

    def _leading(self, call: str, x: Any) -> None:
        check_leading(call, x, self.size)

    def _slot_out(
        self, call: str, out: Any, x: Any, name: str, shape: tuple, out_is_part: bool = False
    ) -> Any:
        return checked_slot_out(call, out, x, name, shape, self.rank, out_is_part)
