"""Calls in flight on one NCCL communicator, and what happens when one fails.

Failure: arrays of calls in flight stay referenced until their event completes. A watchdog
thread polls those events and ``check_async_error``; past the timeout it marks the backend
failed and aborts the communicator, but never while a thread is inside an NCCL call on it
(NCCL forbids concurrent use of one communicator): then the abort waits until that thread
leaves NCCL. Arrays are released only after the abort and once the stream is idle.

A host thread that is still inside NCCL :data:`HOST_HANG_GRACE_S` after its call timed out
(a lazy connect to a peer that never made its first call, or died before it: NCCL blocks
the caller there, and CuPy has no non-blocking communicators to poll) can never be given
the error: the watchdog prints it, naming the call, and ends the job, as torch's watchdog
takes a process down.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from mpi4py import MPI

from .._core.backend import BackendContext, Bootstrap
from .._core.deadline import overdue
from .._core.work import Pending, timeout_error
from .._errors import (
    CollectivesError,
    CollectiveTimeoutError,
    CommunicatorStateError,
    InvalidArgumentError,
)
from .._safety.ending import abort_job
from . import groups
from .device import event_done, finished, new_stream, restore_device, use_device
from .rules import cuda_error, nccl_error

WATCHDOG_PERIOD_S = 0.1
#: how long a host thread may stay inside NCCL after its call timed out before the job ends
HOST_HANG_GRACE_S = 3.0


class NcclPending(Pending):
    event: Any = None
    error: CollectivesError | None = None
    #: the caller's stream the call was ordered after (``wait_issued`` orders it after the
    #: call in turn)
    caller: Any = None

    def __init__(self, backend: WatchedCommunicator, blocking: bool = False):
        super().__init__()
        self.blocking = blocking
        self.backend = backend
        self.held = False  # launched at the end of this thread's group

    def test(self) -> bool:
        if not self.done and self.event is not None:
            try:
                finished = event_done(self.event)
            except self.backend.cupy.cuda.runtime.CUDARuntimeError as e:
                self.backend.fail(cuda_error(self.call, e))
                return False
            if finished:
                self._complete()
        return self.done

    def completed(self) -> None:
        """Its event has been seen complete (by the caller's thread): mark it so."""
        self.caller = None
        if not self.done:
            self._complete()

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

    def wait_issued(self, comm: Any) -> None:
        caller, self.caller = self.caller, None  # (the recorder need not keep the stream)
        if self.event is not None and not self.blocking and caller is not None:
            self.backend.order_after(caller, self.event)  # no user code ran since
        else:
            self.wait(comm)

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


class WatchedCommunicator:
    """One ``cupy.cuda.nccl.NcclCommunicator``, its calls in flight and their watchdog: the
    state :class:`~collectives._nccl.backend.NcclBackend` issues on, and how it fails and aborts.
    """

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
        self._first_timeout = timeout  # until the front end attaches (``timeout``)
        self.stream = new_stream(device)
        with cupy.cuda.Device(device):
            #: recorded on the caller's stream for each call to wait on (``_launch``)
            self._ordering = cupy.cuda.Event(disable_timing=True)
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
        self._context: BackendContext | None = None  # the front end's (NcclBackend.attach)
        self._stop = threading.Event()
        self._warned_host_hang = False
        self._failed_at: float | None = None
        self._drained: Any = None  # the event after which the arrays in flight may go
        self._watchdog = threading.Thread(
            target=self._watch, name="collectives-nccl-watchdog", daemon=True
        )
        self._watchdog.start()

    #: NCCL keeps no MPI communicator busy: the front end may free its one at a close
    unfinished = False

    @property
    def timeout(self) -> float:
        """The communicator's timeout (``comm.timeout``: one set later reaches the watchdog
        too); the one this backend was made with until the front end attaches."""
        context = self._context
        return self._first_timeout if context is None else context.timeout

    @property
    def waiter(self) -> Any:
        """What this backend's pendings are waited with (the front end's rules; None before
        the front end attached its context)."""
        return None if self._context is None else self._context.waiter

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
                self._failed_at = time.monotonic()
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
                elif self._entered is not None:
                    self._host_hangs()
            except Exception as e:  # never die silently: the failure aborts, and we go on
                self.fail(nccl_error("watchdog", e))
        self._release_arrays()

    def _check(self) -> None:
        now = time.monotonic()
        try:
            with self._lock:
                self._in_flight = [e for e in self._in_flight if not finished(e[0])]
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
        if self._context is None or pending is None:  # a group's launch, a split
            return CollectiveTimeoutError(
                f"an NCCL call (a group's end or a split) on rank {self.rank} did not return "
                f"after {waited:.1f} s (timeout {self.timeout:g} s); the communicator is aborted"
            )
        try:
            return self._context.timeout_error(pending, waited)
        except RuntimeError:  # the caller's thread appended to the recorder as it was read
            return self._timeout(None, waited)

    def _host_hangs(self) -> None:
        """A failure is declared while a host thread is inside NCCL: say so once, and end
        the job if the thread is still there :data:`HOST_HANG_GRACE_S` later."""
        entered = self._entered
        what = entered[1].describe() if entered and entered[1] is not None else "an NCCL call"
        if not self._warned_host_hang:
            self._warned_host_hang = True
            sys.stderr.write(
                f"collectives: rank {self.rank}: {what} failed while the host is inside "
                "NCCL; the communicator is aborted when that call returns\n"
            )
        failed_at = self._failed_at
        if entered is None or failed_at is None:
            return
        if time.monotonic() - max(failed_at, entered[0]) < HOST_HANG_GRACE_S:
            return
        if self._context is not None:
            self._context.dump_flight_record()
        sys.stderr.write(
            f"[rank {MPI.COMM_WORLD.Get_rank()}] {type(self._error).__name__}: {self._error}\n"
            f"A host thread is still inside NCCL ({what}) {HOST_HANG_GRACE_S:g} s after the "
            "failure, where no error can reach it: aborting the job.\n"
        )
        abort_job(1)

    def _release_arrays(self) -> None:
        """After the abort (or destroy): drop the arrays once what was queued before it has
        left the stream, so that CuPy's pool cannot hand them out while a kernel still
        writes them. If that never happens within the timeout, they are kept for good."""
        drained, start = self._drained, time.monotonic()
        try:
            while drained is not None and not event_done(drained):
                if overdue(start, self.timeout) is not None:
                    return
                time.sleep(WATCHDOG_PERIOD_S)
        except self.cupy.cuda.runtime.CUDARuntimeError:
            return  # the device has failed: what it holds stays held
        with self._lock:
            self._in_flight.clear()

    def _polled(self, event: Any, call: str) -> bool:
        """Whether ``event`` has completed; a CUDA error fails the backend (and says no).
        Not under ``_lock`` (``fail`` takes it)."""
        try:
            return event_done(event)
        except self.cupy.cuda.runtime.CUDARuntimeError as e:
            self.fail(cuda_error(call, e))
            return False

    def _event(self) -> Any:
        """A completion event; no timing (cheaper). The caller has made our device current."""
        return self.cupy.cuda.Event(disable_timing=True)

    def order_caller_after(self, event: Any) -> None:
        """The caller's current stream on our device waits for ``event``."""
        self.order_after(self.cupy.cuda.get_current_stream(self.device), event)

    def order_after(self, stream: Any, event: Any) -> None:
        """``stream`` (on our device) waits for ``event``."""
        previous = use_device(self.device)
        try:
            stream.wait_event(event)
        finally:
            restore_device(previous, self.device)
