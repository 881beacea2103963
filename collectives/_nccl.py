"""The NCCL backend: ``cupy.cuda.nccl`` on the device's collectives stream.

Stream policy: every NCCL communicator of this process on one device shares one stream
(:func:`device_stream`), so NCCL kernels run on a device in the order they were issued, which
is the same order on every rank when the program issues its calls in the same order (NCCL's
rule for several communicators used together; a sub-communicator with its own stream could
deadlock against another's kernel). Each call is ordered after the caller's current stream on
the communicator's device and (synchronous calls) leaves that stream waiting on its
completion event; the host is not blocked.

Failure: arrays of calls in flight stay referenced until their event completes. A watchdog
thread polls those events and ``check_async_error``; past the timeout it marks the backend
failed and aborts the communicator, but never while a thread is inside an NCCL call on it
(NCCL forbids concurrent use of one communicator): then the abort waits until that thread
leaves NCCL. Arrays are released only after the abort and once the stream is idle.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from typing import Any, Callable

from . import _nccl_group as groups
from . import _numerics
from ._arrays import is_slot
from ._backend import Bootstrap
from ._deadline import overdue
from ._dtypes import COMPLEX, NCCL_OP, NCCL_TYPE
from ._errors import (
    BackendUnavailableError,
    CollectivesError,
    CollectiveTimeoutError,
    CommunicatorStateError,
    InvalidArgumentError,
)
from ._nccl_rules import cuda_error, event_query_done, nccl_error
from ._ops import ReduceOp
from ._work import Pending, timeout_error

WATCHDOG_PERIOD_S = 0.1
#: ncclCommSplit first shipped in NCCL 2.18 (CuPy raises RuntimeError when built before it).
SPLIT_VERSION = 21800

_STREAMS: dict[int, Any] = {}
_STREAMS_LOCK = threading.Lock()


def nccl_unavailable_reason() -> str | None:
    """None when CuPy sees a GPU and NCCL loads; otherwise why not."""
    try:
        import cupy
        from cupy.cuda import nccl
    except Exception as e:  # ImportError, or a CUDA library that fails to load
        return f"CuPy with NCCL is not importable ({e})"
    if not getattr(nccl, "available", True):
        return "CuPy was built or installed without NCCL (pip install nvidia-nccl-cu12 or -cu13)"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "no CUDA device is visible"
    except Exception as e:
        return f"no usable CUDA device ({e})"
    return None


def device_stream(device: int) -> Any:
    """The one stream every NCCL communicator of this process uses on ``device``."""
    import cupy

    with _STREAMS_LOCK:
        stream = _STREAMS.get(device)
        if stream is None:
            with cupy.cuda.Device(device):  # a Stream belongs to the device current at creation
                stream = _STREAMS[device] = cupy.cuda.Stream(non_blocking=True)
        return stream


class NcclPending(Pending):
    event: Any = None
    error: CollectivesError | None = None

    def __init__(self, backend: NcclBackend, blocking: bool = False):
        super().__init__()
        self.blocking = blocking
        self.backend = backend
        self.held = False  # launched at the end of this thread's group

    def test(self) -> bool:
        if not self.done and self.event is not None:
            try:
                finished = _event_done(self.event)
            except self.backend.cupy.cuda.runtime.CUDARuntimeError as e:
                self.backend.fail(cuda_error(self.call, e))
                return False
            if finished:
                self._complete()
        return self.done

    def as_dict(self) -> dict:
        self.test()  # a synchronous call is never waited on again: mark it here
        return super().as_dict()

    def wait(self, comm: Any) -> None:
        self.backend.raise_if_failed()
        if self.error is not None:
            raise self.error
        if self.event is None:
            if self.held and groups.current().open and not self.backend.own_group_open:
                # Held by another communicator's group on this thread: ordered at its end.
                groups.current().wait_at_end(self)
                return
            raise InvalidArgumentError(
                "Work.wait: the call is inside a comm.group() that has not ended; wait after the with-block"
            )
        if self.blocking:
            self.synchronize(comm)
            return
        self.backend.order_caller_after(self.event)

    def synchronize(self, comm: Any) -> None:
        if self.error is not None:
            raise self.error
        if self.event is None:
            raise InvalidArgumentError(
                "Work.synchronize: the call is inside a comm.group() that has not "
                "ended; synchronize after the with-block"
            )
        while not self.test():
            self.backend.raise_if_failed()
            waited = overdue(self.start, self.backend.timeout)
            if waited is not None:
                self.backend.fail(timeout_error(comm, self, waited))
                self.backend.raise_if_failed()
            time.sleep(1e-5 if time.monotonic() - self.start < 0.01 else 1e-3)
        self.backend.raise_if_failed()


class NcclBackend:
    """Collectives over one ``cupy.cuda.nccl.NcclCommunicator``.

    Example:
        >>> impl = make_nccl_backend(MpiBootstrap(mpi_comm), device=0, timeout=600.0)
    """

    name = "nccl"

    def __init__(self, nccl_comm: Any, bootstrap: Bootstrap, device: int, timeout: float):
        import cupy
        from cupy.cuda import nccl

        self.cupy = cupy
        self.nccl = nccl
        self.comm = nccl_comm
        self.bootstrap = bootstrap
        self.rank = bootstrap.rank
        self.size = bootstrap.size
        self.device = device
        self.timeout = timeout
        self.stream = device_stream(device)
        self.has_avg = nccl.get_version() >= 21000
        self._in_flight: list[tuple[NcclPending, tuple]] = []
        self._lock = threading.Lock()
        self._error: CollectivesError | None = None
        # A thread inside an NCCL call on this communicator: (since, pending). Calls held by
        # an open group count in _held: NCCL keeps the communicator in the thread's group.
        self._entered: tuple[float, NcclPending | None] | None = None
        self._held = 0
        self._abort_deferred = False
        self._own_groups = 0
        self._front: Any = None
        self._stop = threading.Event()
        self._warned_host_hang = False
        self._drained: Any = None  # the event after which the arrays in flight may go
        self._watchdog = threading.Thread(
            target=self._watch, name="collectives-nccl-watchdog", daemon=True
        )
        self._watchdog.start()

    @property
    def failure(self) -> CollectivesError | None:
        """The error that ended this backend, or None."""
        return self._error

    @property
    def own_group_open(self) -> bool:
        return self._own_groups > 0

    # ---------------------------------------------------------------- failure handling

    def fail(self, error: CollectivesError) -> None:
        """Remember why (the first reason wins), then abort once no thread is in NCCL on it."""
        with self._lock:
            if self._error is None:
                self._error = error
        self._request_abort()

    def raise_if_failed(self) -> None:
        if self._error is not None:
            raise self._error

    def _request_abort(self) -> None:
        with self._lock:
            if self._entered is not None or self._held:
                self._abort_deferred = True  # done by _leave, in the thread that is inside
                return
            comm, self.comm = self.comm, None
        self._abort_now(comm)

    def _abort_now(self, comm: Any) -> None:
        """Abort ``comm``, taken from ``self.comm`` by this thread. Only the thread that took
        the communicator stops the watchdog, once ``_drained`` is recorded: another that
        finds it gone (None) leaves the arrays to it."""
        if comm is None:
            return
        try:
            with self.cupy.cuda.Device(self.device):
                try:  # completes once what was queued before the abort has left the stream
                    self._drained = self.stream.record(self._event())
                finally:
                    comm.abort()
        except Exception as e:  # the failure is recorded already: say this one, go on
            sys.stderr.write(f"collectives: rank {self.rank}: aborting NCCL failed: {e}\n")
        finally:
            self._stop.set()  # the watchdog releases the arrays once _drained completes

    def _enter(self, pending: NcclPending | None, strict: bool = True) -> None:
        """This thread is about to call NCCL on the communicator. ``strict``: refuse when it
        has failed (not for a groupEnd, which must run whatever happened since groupStart)."""
        with self._lock:
            if strict and self._error is not None:
                raise self._error
            if strict and self.comm is None:
                call = pending.call if pending else "nccl"
                raise CommunicatorStateError(f"{call}: communicator is closed")
            self._entered = (time.monotonic(), pending)

    def _leave(self, released: int = 0) -> None:
        with self._lock:
            self._entered = None
            self._held -= released
            comm = None
            if self._abort_deferred and not self._held:
                self._abort_deferred = False
                comm, self.comm = self.comm, None
                abort = True
            else:
                abort = False
        if abort:
            self._abort_now(comm)

    def _forget(self, pendings: list[NcclPending], error: CollectivesError) -> None:
        """Calls that were never launched: out of the in-flight list, so that they neither
        time out later (aborting a healthy communicator) nor hold their arrays."""
        with self._lock:
            gone = {id(p) for p in pendings}
            self._in_flight = [e for e in self._in_flight if id(e[0]) not in gone]
        for p in pendings:
            p.error, p.state = error, "failed"

    def _watch(self) -> None:
        try:
            self.cupy.cuda.Device(self.device).use()  # this thread's CUDA calls: our device
        except Exception:
            pass
        while not self._stop.wait(WATCHDOG_PERIOD_S):
            try:
                if self._error is None:
                    self._check()
                elif not self._warned_host_hang and self._entered is not None:
                    self._warn_host_hang()
            except Exception as e:  # never die silently: the failure aborts, and we go on
                self.fail(nccl_error("watchdog", e))
        self._release_arrays()

    def _check(self) -> None:
        now = time.monotonic()
        try:
            with self._lock:
                self._in_flight = [e for e in self._in_flight if not _finished(e[0])]
                launched = [p for p, _ in self._in_flight if p.event is not None]
                entered = self._entered
        except self.cupy.cuda.runtime.CUDARuntimeError as e:  # a fault: the device is lost
            self.fail(cuda_error("watchdog", e))
            return
        # A host thread stuck in NCCL (a lazy connect to a missing peer) is timed from when
        # it entered; launched calls from when they were issued (the list is in issue order).
        if entered is not None and (waited := overdue(entered[0], self.timeout, now)):
            self.fail(self._timeout(entered[1], waited))
            return
        if launched and (waited := overdue(launched[0].start, self.timeout, now)):
            self.fail(self._timeout(launched[0], waited))
            return
        try:
            with self._lock:  # close() and abort() take the communicator under this lock
                if self.comm is not None and self._entered is None:
                    self.comm.check_async_error()
        except Exception as e:
            self.fail(nccl_error("NCCL reported an asynchronous error", e))

    def _timeout(self, pending: NcclPending | None, waited: float) -> CollectivesError:
        if self._front is None or pending is None:  # a group's launch, a split
            return CollectiveTimeoutError(
                f"an NCCL call (a group's end or a split) on rank {self.rank} did not return "
                f"after {waited:.1f} s (timeout {self.timeout:g} s); the communicator is aborted"
            )
        try:
            return timeout_error(self._front, pending, waited)
        except RuntimeError:  # the caller's thread appended to the recorder as it was read
            return self._timeout(None, waited)

    def _warn_host_hang(self) -> None:
        self._warned_host_hang = True
        entered = self._entered
        what = entered[1].describe() if entered and entered[1] is not None else "an NCCL call"
        sys.stderr.write(
            f"collectives: rank {self.rank}: {what} timed out while the host is inside NCCL; "
            "the communicator is aborted when that call returns\n"
        )

    def _release_arrays(self) -> None:
        """After the abort (or destroy): drop the arrays once what was queued before it has
        left the stream, so that CuPy's pool cannot hand them out while a kernel still
        writes them. If that never happens within the timeout, they are kept for good."""
        drained, start = self._drained, time.monotonic()
        try:
            while drained is not None and not _event_done(drained):
                if overdue(start, self.timeout) is not None:
                    return
                time.sleep(WATCHDOG_PERIOD_S)
        except self.cupy.cuda.runtime.CUDARuntimeError:
            return  # the device has failed: what it holds stays held
        with self._lock:
            self._in_flight.clear()

    # ---------------------------------------------------------------- issuing

    def check_arrays(self, call: str, x: Any, out: Any) -> None:
        for arg, a in (("x", x), ("out", out)):
            if a is None:
                continue
            if not isinstance(a, self.cupy.ndarray):
                raise InvalidArgumentError(
                    f"{call}: {arg} must be a CuPy array on device {self.device} for the "
                    f"nccl backend, got {type(a).__module__}.{type(a).__name__}"
                )
            if a.device.id != self.device:
                raise InvalidArgumentError(
                    f"{call}: {arg} is on device {a.device.id}, expected device "
                    f"{self.device} (the communicator's)"
                )

    def _polled(self, event: Any, call: str) -> bool:
        """Whether ``event`` has completed; a CUDA error fails the backend (and says no).
        Not under ``_lock`` (``fail`` takes it)."""
        try:
            return _event_done(event)
        except self.cupy.cuda.runtime.CUDARuntimeError as e:
            self.fail(cuda_error(call, e))
            return False

    def _event(self) -> Any:
        """A completion event; no timing (cheaper). The caller has made our device current."""
        return self.cupy.cuda.Event(disable_timing=True)

    def order_caller_after(self, event: Any) -> None:
        """The caller's current stream on our device waits for ``event``."""
        with self.cupy.cuda.Device(self.device):
            self.cupy.cuda.get_current_stream(self.device).wait_event(event)

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
        array = arrays[0] if arrays and arrays[0] is not None else None
        # For a message while issuing; the front end fills in the final entry afterwards.
        seq = 0 if self._front is None else self._front._books.seq
        pending.info = (seq, call, getattr(array, "shape", None), None)
        state = groups.current()
        self._prune()
        with self.cupy.cuda.Device(self.device):
            self._enter(pending)
            # In flight before issuing: NCCL connects lazily, and a connect to a missing peer
            # blocks this thread; the watchdog must see the call to time it out.
            with self._lock:
                self._in_flight.append((pending, arrays))
            try:
                # Every call, grouped ones included: the caller may have queued more work on
                # its stream between two calls of a group (NCCL launches them at its end).
                caller = self.cupy.cuda.get_current_stream(self.device)
                if caller.ptr != self.stream.ptr:
                    self.stream.wait_event(caller.record(self._event()))
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
        """Mark finished calls completed (in the caller's thread: the flight recorder and
        the timeline are not the watchdog's to touch)."""
        try:
            with self._lock:
                finished = [p for p, _ in self._in_flight if _finished(p)]
        except self.cupy.cuda.runtime.CUDARuntimeError as e:
            self.fail(cuda_error("a call in flight", e))
            return
        for p in finished:
            p.test()

    @staticmethod
    def _count(a: Any, name: str) -> tuple[int, int]:
        return (a.size * 2 if name in COMPLEX else a.size), NCCL_TYPE[name]

    def _op(self, op: ReduceOp) -> int:
        return NCCL_OP[ReduceOp.SUM if op is ReduceOp.AVG and not self.has_avg else op]

    def _avg_fallback(self, op: ReduceOp, out: Any) -> Callable[[], None] | None:
        """NCCL before 2.10 has no ncclAvg: the division that follows the reduction on the
        stream (``_launch``'s ``then``), or None."""
        if op is ReduceOp.AVG and not self.has_avg:
            return lambda: _numerics.divide_in_place(out, self.size)
        return None

    # Each verb: (x, out, name, op, root) -> NcclPending. Everything a verb enqueues goes
    # through ``issue`` (NCCL) and ``then`` (what follows it), so that the completion event is
    # recorded after all of it.

    def all_reduce(self, x: Any, out: Any, name: str, op: Any, root: Any) -> NcclPending:
        count, dtype = self._count(x, name)
        code = self._op(op)

        return self._launch(
            "all_reduce",
            (x, out),
            lambda s: self.comm.allReduce(x.data.ptr, out.data.ptr, count, dtype, code, s),
            then=self._avg_fallback(op, out),
        )

    def reduce(self, x: Any, out: Any, name: str, op: Any, root: Any) -> NcclPending:
        count, dtype = self._count(x, name)
        code = self._op(op)
        target = x if out is None else out

        return self._launch(
            "reduce",
            (x, target),
            lambda s: self.comm.reduce(x.data.ptr, target.data.ptr, count, dtype, code, root, s),
            then=None if out is None else self._avg_fallback(op, out),
        )

    def broadcast(self, x: Any, out: Any, name: str, op: Any, root: Any) -> NcclPending:
        count, dtype = self._count(x, name)
        return self._launch(
            "broadcast",
            (x,),
            lambda s: self.comm.broadcast(x.data.ptr, x.data.ptr, count, dtype, root, s),
        )

    def all_gather(self, x: Any, out: Any, name: str, op: Any, root: Any) -> NcclPending:
        count, dtype = self._count(x, name)
        return self._launch(
            "all_gather",
            (x, out),
            lambda s: self.comm.allGather(x.data.ptr, out.data.ptr, count, dtype, s),
        )

    def reduce_scatter(self, x: Any, out: Any, name: str, op: Any, root: Any) -> NcclPending:
        count, dtype = self._count(out, name)
        code = self._op(op)

        return self._launch(
            "reduce_scatter",
            (x, out),
            lambda s: self.comm.reduceScatter(x.data.ptr, out.data.ptr, count, dtype, code, s),
            then=self._avg_fallback(op, out),
        )

    def all_to_all(self, x: Any, out: Any, name: str, op: Any, root: Any) -> NcclPending:
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

    def gather(self, x: Any, out: Any, name: str, op: Any, root: Any) -> NcclPending:
        count, dtype = self._count(x, name)
        sends, receives = [(x, root)], []
        if out is not None:
            receives = [(out[j], j) for j in range(self.size)]
            if is_slot(x, out, root):  # in place: root's own block is already there
                sends, receives = [], [(out[j], j) for j in range(self.size) if j != root]
        return self._launch(
            "gather", (x, out), lambda s: self._grouped_p2p(s, sends, receives, count, dtype)
        )

    def scatter(self, x: Any, out: Any, name: str, op: Any, root: Any) -> NcclPending:
        count, dtype = self._count(out, name)
        sends, receives = [], [(out, root)]
        if x is not None:
            sends = [(x[j], j) for j in range(self.size)]
            if is_slot(out, x, root):
                sends, receives = [(x[j], j) for j in range(self.size) if j != root], []
        return self._launch(
            "scatter", (x, out), lambda s: self._grouped_p2p(s, sends, receives, count, dtype)
        )

    def send(self, x: Any, out: Any, name: str, op: Any, root: Any) -> NcclPending:
        count, dtype = self._count(x, name)
        return self._launch(
            "send", (x,), lambda s: self.comm.send(x.data.ptr, count, dtype, root, s)
        )

    def recv(self, x: Any, out: Any, name: str, op: Any, root: Any) -> NcclPending:
        count, dtype = self._count(out, name)
        return self._launch(
            "recv", (out,), lambda s: self.comm.recv(out.data.ptr, count, dtype, root, s)
        )

    def barrier(self, x: Any, out: Any, name: Any, op: Any, root: Any) -> NcclPending:
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
        end_group(self.nccl)

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

    def attach(self, front: Any) -> None:
        """Give the watchdog the front end, for the messages it writes."""
        self._front = front


def end_group(nccl: Any) -> None:
    """``groupEnd`` for this thread; at the outermost one, complete every communicator's
    held calls, then order the synchronous callers after them."""
    state = groups.current()
    batch = state.leave()
    owners = batch.owners() if batch is not None else []
    for b in owners:
        b._enter(None, strict=False)  # a connect that hangs in groupEnd is timed by each watchdog
    try:
        nccl.groupEnd()
    except Exception as e:
        error = nccl_error("group", e)
        for b in owners:
            b._forget(batch.held.get(b, []) if batch else [], error)
        raise error from e
    finally:
        for b in owners:
            b._leave(released=len(batch.held.get(b, [])) if batch else 0)
    if batch is None:
        return
    for b in owners:
        b._complete_group(batch.held.get(b, []), batch.after.get(b, []))
    failures = []
    for pending in batch.waits:  # every caller is ordered, whichever backend has failed
        try:
            pending.wait(pending.backend._front)
        except CollectivesError as e:
            failures.append(e)
    if failures:
        raise failures[0]


def _finished(pending: NcclPending) -> bool:
    event = pending.event
    return event is not None and _event_done(event)


def _event_done(event: Any) -> bool:
    """Whether a ``cupy.cuda.Event`` has completed. CuPy's ``Event.done`` is
    ``eventQuery(ptr) == 0``, which after a kernel fault says "not yet" for ever; this
    raises ``CUDARuntimeError`` for a status other than success or not-ready."""
    from cupy.cuda import runtime

    return event_query_done(runtime.eventQuery(event.ptr), runtime.CUDARuntimeError)


def create_communicator(bootstrap: Bootstrap, device: int) -> Any:
    """An ``NcclCommunicator`` over the bootstrap's ranks: rank 0 makes the unique id (bytes
    on CuPy 14, a tuple on CuPy 13), the bootstrap shares it, every rank joins."""
    import cupy
    from cupy.cuda import nccl

    uid = bootstrap.share(nccl.get_unique_id)
    with cupy.cuda.Device(device):
        return nccl.NcclCommunicator(bootstrap.size, uid, bootstrap.rank)


def choose_device(device: int | None, local_rank: int) -> int:
    """The GPU this rank uses: ``device``, or ``local_rank % device_count``."""
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    chosen = local_rank % count if device is None else device
    if not 0 <= chosen < count:
        raise InvalidArgumentError(f"init: device must be in [0, {count}), got {device}")
    return chosen


def placement(device: int) -> tuple[str, str, str, str | None, int]:
    """(host, the GPU's PCI bus id, its UUID, ``NCCL_MULTI_RANK_GPU_ENABLE``, NCCL version):
    what :func:`collectives._nccl_rules.shared_gpu_reason` decides from."""
    import cupy
    from cupy.cuda import nccl

    # NCCL 2.30.7+ tells GPUs apart by UUID (two MIG instances share a bus id); before, by bus id.
    uuid = cupy.cuda.runtime.getDeviceProperties(device).get("uuid", b"")
    return (
        socket.gethostname(),
        cupy.cuda.Device(device).pci_bus_id,
        bytes(uuid).hex(),
        os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE"),
        nccl.get_version(),
    )


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
