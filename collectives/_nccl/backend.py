"""The NCCL backend: ``cupy.cuda.nccl`` on the device's collectives stream.

Stream policy: each communicator issues on a stream of its own (:func:`new_stream`), as
torch's ProcessGroupNCCL does, so a call stuck on one communicator never holds up another's
calls (whose watchdogs would then time out healthy communicators). Each call is ordered
after the caller's current stream on the communicator's device by an event and (synchronous
calls) leaves that stream waiting on its completion event; the host is not blocked. Calls on
two communicators are ordered only through the caller's stream: a synchronous call orders
the next one, an ``async_op=True`` call does not until its ``Work.wait()``.

Failure handling, the watchdog and the calls in flight are in :mod:`collectives._nccl.flight`; the
device, its stream and communicator creation in :mod:`collectives._nccl.device`.
"""

from __future__ import annotations

import time
from typing import Any, Callable, NoReturn

from .. import _numerics
from .._arrays import is_slot
from .._core.backend import BackendContext, Bootstrap, Stager
from .._core.deadline import overdue
from .._dtypes import COMPLEX, NCCL_OP, NCCL_TYPE
from .._errors import (
    BackendUnavailableError,
    CollectivesError,
    CommunicatorStateError,
    InvalidArgumentError,
)
from .._ops import AVG, SUM, ReduceOp
from . import groups
from .device import (
    choose_device,
    create_communicator,
    nccl_unavailable_reason,
    new_stream,
    placement,
    restore_device,
    use_device,
)
from .device import event_done as _event_done  # noqa: F401  (imported from here)
from .device import finished as _finished
from .flight import WATCHDOG_PERIOD_S, NcclPending, WatchedCommunicator
from .nan import nan_flags, put_nan
from .rules import cuda_error, nccl_error

__all__ = [
    "SPLIT_VERSION",
    "WATCHDOG_PERIOD_S",
    "NcclBackend",
    "NcclPending",
    "choose_device",
    "create_communicator",
    "make_nccl_backend",
    "nccl_unavailable_reason",
    "new_stream",
    "placement",
]

#: (datatype, op) of the NaN bytes beside a max or min: uint8, MAX
_FLAGS = (NCCL_TYPE["uint8"], NCCL_OP[ReduceOp.MAX])

#: ncclCommSplit first shipped in NCCL 2.18 (CuPy raises RuntimeError when built before it).
SPLIT_VERSION = 21800


class NcclBackend(WatchedCommunicator):
    """Collectives over one ``cupy.cuda.nccl.NcclCommunicator``.

    Example:
        >>> impl, extra = make_nccl_backend(MpiBootstrap(mpi_comm), device=0, timeout=600.0)  # doctest: +SKIP
    """

    name = "nccl"
    #: CuPy arrays on the communicator's device only (:meth:`check_arrays`)
    checks_arrays = True
    #: device arrays go to NCCL as they are
    stager: Stager | None = None
    #: the caller's current stream, as the checks of the call being issued read it (the
    #: front end runs them just before the verb, holding the communicator), or None
    _checked_caller: Any = None

    # ---------------------------------------------------------------- issuing

    def check_arrays(self, call: str, x: Any, out: Any) -> None:
        self._checked_caller = None
        caller = self._check_not_capturing(call)
        ndarray, device = self.cupy.ndarray, self.device
        if x is not None and (not isinstance(x, ndarray) or x.device.id != device):
            self._refuse(call, "x", x)
        if out is not None and out is not x:
            if not isinstance(out, ndarray) or out.device.id != device:
                self._refuse(call, "out", out)
        self._checked_caller = caller

    def _refuse(self, call: str, arg: str, a: Any) -> NoReturn:
        """Raise the error for an array this backend cannot take: not CuPy's, or on another
        device than the communicator's."""
        if not isinstance(a, self.cupy.ndarray):
            raise InvalidArgumentError(
                f"{call}: {arg} must be a CuPy array on device {self.device} for the "
                f"nccl backend, got {type(a).__module__}.{type(a).__name__}"
            )
        current = self.cupy.cuda.Device().id
        hint = (
            f"; this thread's current device is {current}: make the arrays inside "
            "`with comm.device_scope():`"
            if current != self.device
            else ""
        )
        raise InvalidArgumentError(
            f"{call}: {arg} is on device {a.device.id}, expected device "
            f"{self.device} (the communicator's){hint}"
        )

    def _check_not_capturing(self, call: str) -> Any:
        """Refuse a call while the caller's stream captures a CUDA graph: each call's
        completion is watched through an event recorded as it is issued, which a replay of
        the graph would not record again (the watchdog would wait for it forever). The
        caller's stream."""
        caller = self.cupy.cuda.get_current_stream(self.device)
        try:
            capturing = caller.is_capturing()
        except self.cupy.cuda.runtime.CUDARuntimeError as e:  # e.g. the legacy stream
            raise InvalidArgumentError(
                f"{call}: the current stream cannot say whether it captures a CUDA graph "
                f"({e}); make the call outside any capture"
            ) from e
        if capturing:
            raise InvalidArgumentError(
                f"{call}: the current stream is capturing a CUDA graph, and calls on the nccl "
                "backend cannot be captured (their completion is watched through events that "
                "a replay would not record): make the call outside the capture"
            )
        return caller

    def _launch(
        self,
        call: str,
        arrays: tuple,
        issue: Callable[[int], None],
        blocking: bool = False,
        then: Callable[[], None] | None = None,
    ) -> NcclPending:
        """Order after the caller's stream, issue the NCCL calls, queue ``then`` (work on the
        stream that follows them: at the group's end inside one), record completion."""
        pending = NcclPending(self, blocking)
        # For a message while issuing; the front end fills in the final entry afterwards.
        context = self._context
        current = None if context is None else context.current()
        if current is not None and current[1] == call:  # as the front end numbered it
            pending.info = current
        else:  # (NumPy's dtype.name is slow: a call numbered by the front end skips it)
            array = arrays[0] if arrays and arrays[0] is not None else None
            dtype = getattr(array, "dtype", None)
            seq = 0 if context is None else context.seq()
            pending.info = (seq, call, getattr(array, "shape", None), dtype and dtype.name)
        state = groups.current()
        self._prune()
        previous = use_device(self.device)
        try:
            self._enter(pending)
            # In flight before issuing: NCCL connects lazily, and a connect to a missing peer
            # blocks this thread; the watchdog must see the call to time it out.
            with self._lock:
                self._in_flight.append((pending, arrays))
            try:
                # Every call, grouped ones included: the caller may have queued more work on
                # its stream between two calls of a group (NCCL launches them at its end).
                caller = self._checked_caller  # the call's checks have just read it
                if caller is None:  # a verb called without them
                    caller = self.cupy.cuda.get_current_stream(self.device)
                self._checked_caller = None
                pending.caller = caller
                if caller.ptr != self.stream.ptr:
                    # one event serves every call: a wait takes the record made before it
                    self.stream.wait_event(caller.record(self._ordering))
                issue(self.stream.ptr)
            except Exception as e:
                error = self._error or nccl_error(call, e)
                self._forget([pending], error)
                self._leave()
                raise error from e
            try:
                if then is not None and state.open:
                    state.then(self, then)
                elif then is not None:
                    with self.stream:
                        then()
                if state.open:
                    pending.held = True
                    state.hold(self, pending)
                    with self._lock:
                        self._held += 1
                else:
                    pending.event = self.stream.record(self._event())
            except Exception as e:
                # The NCCL calls are enqueued and the peers take part in them: the call stays
                # in flight (its arrays with it) until the stream passes it, and its result is
                # not what was asked for, so the communicator fails.
                error = nccl_error(call, e)
                self._failed_after_issue(pending, error)
                raise (self._error or error) from e
            finally:
                self._leave()
        finally:
            restore_device(previous, self.device)
        self.raise_if_failed()
        return pending

    def _failed_after_issue(self, pending: NcclPending, error: CollectivesError) -> None:
        """Keep ``pending`` in flight with an event after what was enqueued (where one can be
        recorded), and fail: the abort waits for this thread to leave NCCL."""
        if pending.event is None and not pending.held:
            try:
                pending.event = self.stream.record(self._event())
            except Exception:
                pass  # no event: the entry stays until the abort's drain releases it
        self.fail(error)

    def _prune(self) -> None:
        """Mark finished calls completed and let their arrays go (in the caller's thread: the
        flight recorder and the timeline are not the watchdog's to touch). Calls on one
        stream finish in issue order: the first unfinished one ends the look, so a host that
        issues far ahead of the device pays for the calls that finished, not for every call
        in flight."""
        try:
            with self._lock:
                done = 0
                for p, _ in self._in_flight:
                    if not _finished(p):
                        break
                    done += 1
                if not done:
                    return
                finished = self._in_flight[:done]
                del self._in_flight[:done]
        except self.cupy.cuda.runtime.CUDARuntimeError as e:
            self.fail(cuda_error("a call in flight", e))
            return
        for p, _ in finished:
            p.completed()

    @staticmethod
    def _count(a: Any, name: str) -> tuple[int, int]:
        return (a.size * 2 if name in COMPLEX else a.size), NCCL_TYPE[name]

    def _op(self, op: ReduceOp) -> int:
        return NCCL_OP[SUM if op is AVG and not self.has_avg else op]

    def _avg_fallback(self, op: ReduceOp, out: Any) -> Callable[[], None] | None:
        """NCCL before 2.10 has no ncclAvg: the division that follows the reduction on the
        stream (``_launch``'s ``then``), or None."""
        if op is AVG and not self.has_avg:
            return lambda: _numerics.divide_in_place(out, self.size)
        return None

    # Each verb takes what it needs (see Backend) -> NcclPending. Everything a verb enqueues goes
    # through ``issue`` (NCCL) and ``then`` (what follows it), so that the completion event is
    # recorded after all of it.

    def all_reduce(self, x: Any, out: Any, name: str, op: Any) -> NcclPending:
        count, dtype = self._count(x, name)
        code = self._op(op)
        flags = nan_flags(self.cupy, op, name, x, self.device)
        if flags is not None:
            return self._launch(
                "all_reduce",
                (x, out, flags),
                lambda s: self._in_one_group(
                    lambda: self.comm.allReduce(x.data.ptr, out.data.ptr, count, dtype, code, s),
                    lambda: self.comm.allReduce(
                        flags.data.ptr, flags.data.ptr, flags.size, *_FLAGS, s
                    ),
                ),
                then=lambda: put_nan(out, flags, name),
            )
        return self._launch(
            "all_reduce",
            (x, out),
            lambda s: self.comm.allReduce(x.data.ptr, out.data.ptr, count, dtype, code, s),
            then=self._avg_fallback(op, out),
        )

    def reduce(self, x: Any, out: Any, name: str, op: Any, root: int) -> NcclPending:
        count, dtype = self._count(x, name)
        code = self._op(op)
        target = x if out is None else out
        flags = nan_flags(self.cupy, op, name, x, self.device)
        if flags is not None:
            return self._launch(
                "reduce",
                (x, target, flags),
                lambda s: self._in_one_group(
                    lambda: self.comm.reduce(
                        x.data.ptr, target.data.ptr, count, dtype, code, root, s
                    ),
                    lambda: self.comm.reduce(
                        flags.data.ptr, flags.data.ptr, flags.size, *_FLAGS, root, s
                    ),
                ),
                then=(lambda: put_nan(target, flags, name)) if self.rank == root else None,
            )
        return self._launch(
            "reduce",
            (x, target),
            lambda s: self.comm.reduce(x.data.ptr, target.data.ptr, count, dtype, code, root, s),
            then=None if out is None else self._avg_fallback(op, out),
        )

    def broadcast(self, x: Any, name: str, root: int) -> NcclPending:
        count, dtype = self._count(x, name)
        return self._launch(
            "broadcast",
            (x,),
            lambda s: self.comm.broadcast(x.data.ptr, x.data.ptr, count, dtype, root, s),
        )

    def all_gather(self, x: Any, out: Any, name: str) -> NcclPending:
        count, dtype = self._count(x, name)
        return self._launch(
            "all_gather",
            (x, out),
            lambda s: self.comm.allGather(x.data.ptr, out.data.ptr, count, dtype, s),
        )

    def reduce_scatter(self, x: Any, out: Any, name: str, op: Any) -> NcclPending:
        count, dtype = self._count(out, name)
        code = self._op(op)
        flags = nan_flags(self.cupy, op, name, x, self.device)
        if flags is not None:
            with self.cupy.cuda.Device(self.device):
                mine = self.cupy.empty(out.shape, self.cupy.uint8)
            return self._launch(
                "reduce_scatter",
                (x, out, flags, mine),
                lambda s: self._in_one_group(
                    lambda: self.comm.reduceScatter(
                        x.data.ptr, out.data.ptr, count, dtype, code, s
                    ),
                    lambda: self.comm.reduceScatter(
                        flags.data.ptr, mine.data.ptr, mine.size, *_FLAGS, s
                    ),
                ),
                then=lambda: put_nan(out, mine, name),
            )
        return self._launch(
            "reduce_scatter",
            (x, out),
            lambda s: self.comm.reduceScatter(x.data.ptr, out.data.ptr, count, dtype, code, s),
            then=self._avg_fallback(op, out),
        )

    def all_to_all(self, x: Any, out: Any, name: str) -> NcclPending:
        in_place = out is x
        if in_place and groups.current().open:
            raise InvalidArgumentError(
                "all_to_all: the in-place form (out is x) cannot run inside "
                "comm.group() on NCCL; pass a distinct out"
            )
        target = out
        if in_place:
            with self.cupy.cuda.Device(self.device):  # on out's device, whichever is current
                target = self.cupy.empty_like(out)
        count, dtype = self._count(x[0], name) if x.shape[0] else (0, NCCL_TYPE[name])

        def copy_back() -> None:  # on the stream, after the exchange
            out[...] = target

        return self._launch(
            "all_to_all",
            (x, out, target),
            lambda s: self._grouped_p2p(
                s,
                [(x[j], j) for j in range(self.size)],
                [(target[j], j) for j in range(self.size)],
                count,
                dtype,
            ),
            then=copy_back if in_place else None,
        )

    def gather(self, x: Any, out: Any, name: str, root: int) -> NcclPending:
        count, dtype = self._count(x, name)
        sends, receives = [(x, root)], []
        if out is not None:
            receives = [(out[j], j) for j in range(self.size)]
            if is_slot(x, out, root):  # in place: root's own block is already there
                sends, receives = [], [(out[j], j) for j in range(self.size) if j != root]
        return self._launch(
            "gather", (x, out), lambda s: self._grouped_p2p(s, sends, receives, count, dtype)
        )

    def scatter(self, x: Any, out: Any, name: str, root: int) -> NcclPending:
        count, dtype = self._count(out, name)
        sends, receives = [], [(out, root)]
        if x is not None:
            sends = [(x[j], j) for j in range(self.size)]
            if is_slot(out, x, root):
                sends, receives = [(x[j], j) for j in range(self.size) if j != root], []
        return self._launch(
            "scatter", (x, out), lambda s: self._grouped_p2p(s, sends, receives, count, dtype)
        )

    def send(self, x: Any, name: str, peer: int) -> NcclPending:
        count, dtype = self._count(x, name)
        return self._launch(
            "send", (x,), lambda s: self.comm.send(x.data.ptr, count, dtype, peer, s)
        )

    def recv(self, out: Any, name: str, peer: int) -> NcclPending:
        count, dtype = self._count(out, name)
        return self._launch(
            "recv", (out,), lambda s: self.comm.recv(out.data.ptr, count, dtype, peer, s)
        )

    def sendrecv(self, x: Any, out: Any, name: str, peer: int, source: int) -> NcclPending:
        count, dtype = self._count(x, name)
        return self._launch(
            "sendrecv",
            (x, out),
            lambda s: self._grouped_p2p(s, [(x, peer)], [(out, source)], count, dtype),
        )

    def barrier(self) -> NcclPending:
        with self.cupy.cuda.Device(self.device):
            token = self.cupy.zeros(1, self.cupy.int32)
        return self._launch(
            "barrier",
            (token,),
            lambda s: self.comm.allReduce(
                token.data.ptr, token.data.ptr, 1, NCCL_TYPE["int32"], NCCL_OP[ReduceOp.SUM], s
            ),
            blocking=True,
        )

    def _in_one_group(self, *calls: Callable[[], None]) -> None:
        self.nccl.groupStart()
        try:
            for call in calls:
                call()
        finally:
            self.nccl.groupEnd()

    def _grouped_p2p(
        self, stream: int, sends: list, receives: list, count: int, dtype: int
    ) -> None:
        self.nccl.groupStart()
        try:
            for buf, peer in sends:
                self.comm.send(buf.data.ptr, count, dtype, peer, stream)
            for buf, peer in receives:
                self.comm.recv(buf.data.ptr, count, dtype, peer, stream)
        finally:
            self.nccl.groupEnd()

    # ---------------------------------------------------------------- groups

    def group_start(self) -> None:
        # A failed backend does not refuse here: the first call inside the group raises its
        # failure through the front end, which then declares the communicator dead.
        state = groups.current()
        try:
            self.nccl.groupStart()
        except Exception as e:
            raise nccl_error("group", e) from e
        state.enter()
        self._own_groups += 1

    def group_end(self, pendings: list) -> None:
        self._own_groups -= 1
        groups.end_group(self.nccl)

    def _complete_group(self, pendings: list[NcclPending], after: list[Callable[[], None]]) -> None:
        """The outermost groupEnd has launched our held calls: queue what must follow them
        and record the event they complete with."""
        with self.cupy.cuda.Device(self.device):
            with self.stream:
                for work in after:
                    work()
            event = self.stream.record(self._event())
        now = time.monotonic()
        for pending in pendings:
            pending.event = event
            pending.start = now  # launched only now: a long group must not count as waiting

    # ---------------------------------------------------------------- structure and lifetime

    def _drain(self, call: str) -> None:
        """Wait until every call on this communicator has finished, under the timeout."""
        with self.cupy.cuda.Device(self.device):
            drained = self.stream.record(self._event())
        start = time.monotonic()
        while not self._polled(drained, call):
            self.raise_if_failed()
            if (waited := overdue(start, self.timeout)) is not None:
                self.fail(
                    CollectivesError(
                        f"{call}: the calls in flight did not finish within {waited:.1f} s "
                        f"(timeout {self.timeout:g} s); the communicator is aborted"
                    )
                )
                self.raise_if_failed()
            time.sleep(1e-3)

    def _can_split(self) -> bool:
        return (
            hasattr(self.comm, "commSplit")
            and self.nccl.get_build_version() >= SPLIT_VERSION
            and self.nccl.get_version() >= SPLIT_VERSION
        )

    def split(self, child_mpi: Any, color: int | None, key: int) -> tuple[Any, dict]:
        """A backend over the ranks of ``color``: ``ncclCommSplit`` where every rank's NCCL
        has it, else a fresh communicator whose unique id travels over ``child_mpi``."""
        if groups.current().open:
            raise InvalidArgumentError("split: cannot split inside comm.group()")
        # CuPy's commSplit: "there should not be any outstanding NCCL operations on the comm.
        # Otherwise, it might cause a deadlock."
        self._drain("split")
        child_boot = self.bootstrap.child(child_mpi)
        # One choice for all ranks: commSplit is collective over the parent. _can_split
        # excludes a CuPy or NCCL without it (CuPy's "not available in this version").
        use_split = all(self.bootstrap.allgather(self._can_split()))
        child = None
        if use_split:
            self._enter(None)
            try:
                with self.cupy.cuda.Device(self.device):
                    child = self.comm.commSplit(-1 if color is None else color, key)
            except Exception as e:  # the other ranks are in ncclCommSplit: no fallback here
                raise nccl_error("split", e) from e
            finally:
                self._leave()
        if not use_split and child_boot is not None:
            try:
                child = create_communicator(child_boot, self.device)
            except Exception as e:
                raise nccl_error("split", e) from e
        if child is None or child_boot is None:
            return None, {}
        impl = NcclBackend(child, child_boot, self.device, self.timeout)
        return impl, {"device": self.device, "stream": impl.stream}

    def close(self) -> None:
        """Destroy once the work in flight has finished; abort if it has not within the
        timeout (a peer that never arrives must not hang ``close``)."""
        if groups.current().open:  # NCCL would defer the destroy (or abort) to the group's end
            raise CommunicatorStateError("close: inside comm.group(); close after the with-block")
        with self._lock:
            comm, self.comm = self.comm, None
        if comm is None:  # taken by an abort, which stops the watchdog once it is through
            return
        with self.cupy.cuda.Device(self.device):
            drained = self.stream.record(self._event())
            start = time.monotonic()
            while not self._polled(drained, "close"):
                # A failure declared meanwhile (the watchdog's timeout, a CUDA error) found no
                # communicator to abort: abort it here rather than wait out the timeout.
                if self._error is not None or overdue(start, self.timeout) is not None:
                    comm.abort()
                    break
                time.sleep(1e-3)
            else:
                comm.destroy()
            self._drained = drained
        self._stop.set()

    def abort(self) -> None:
        self._request_abort()

    @property
    def xp(self) -> Any:
        """CuPy: the nccl backend takes device arrays only."""
        return self.cupy

    def attach(self, context: BackendContext) -> None:
        """Take the front end's context: the seq and the timeout messages name its calls."""
        self._context = context

    #: which calls it makes (``comm.call_path``)
    call_form = "NCCL calls on the communicator's own stream"

    def drain(self) -> None:
        """Nothing: ``close`` waits for the calls in flight itself (and aborts past the timeout)."""


def make_nccl_backend(
    bootstrap: Bootstrap, device: int, timeout: float
) -> tuple[NcclBackend, dict]:
    """The backend and the Communicator's extra fields for a fresh NCCL communicator."""
    import cupy

    cupy.cuda.Device(device).use()
    try:
        nccl_comm = create_communicator(bootstrap, device)
    except CollectivesError:
        raise
    except Exception as e:
        why = str(nccl_error("init", e)).removeprefix("init: ")
        raise BackendUnavailableError(f"init: NCCL communicator creation failed: {why}") from e
    impl = NcclBackend(nccl_comm, bootstrap, device, timeout)
    return impl, {"device": device, "stream": impl.stream}
