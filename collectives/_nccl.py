"""The NCCL backend: ``cupy.cuda.nccl`` on the communicator's own stream.

Stream semantics: each call is ordered after the caller's current stream, runs on
``self.stream``, and (synchronous calls) leaves the caller's current stream waiting on its
completion event; the host is not blocked. Arrays of calls in flight stay referenced until
their event completes, so CuPy's memory pool cannot hand them out early. A watchdog thread
polls those events and ``check_async_error``; past the timeout it aborts the communicator,
and the next call or wait raises :class:`CollectiveTimeoutError`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from ._arrays import is_slot
from ._dtypes import COMPLEX, NCCL_OP, NCCL_TYPE
from ._errors import BackendUnavailableError, CollectivesError, invalid
from ._ops import ReduceOp
from ._work import Pending, timeout_error

WATCHDOG_PERIOD_S = 0.1


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


class NcclPending(Pending):
    def __init__(self, backend: NcclBackend, blocking: bool = False):
        super().__init__()
        self.event: Any = None
        self.blocking = blocking
        self.backend = backend

    def test(self) -> bool:
        if not self.done and self.event is not None and self.event.done:
            self._complete()
        return self.done

    def wait(self, comm: Any) -> None:
        if self.event is None:
            raise invalid(
                "Work.wait",
                "the call is inside a comm.group() that has not ended; wait after the with-block",
            )
        if self.blocking:
            self.synchronize(comm)
            return
        self.backend.raise_if_failed(comm)
        import cupy

        cupy.cuda.get_current_stream().wait_event(self.event)

    def synchronize(self, comm: Any) -> None:
        if self.event is None:
            raise invalid(
                "Work.synchronize",
                "the call is inside a comm.group() that has not "
                "ended; synchronize after the with-block",
            )
        start = self.start
        while not self.test():
            self.backend.raise_if_failed(comm)
            now = time.monotonic()
            if now - start > comm.timeout:
                self.backend.fail(timeout_error(comm, self, now - start))
                self.backend.raise_if_failed(comm)
            time.sleep(1e-5 if now - start < 0.01 else 1e-3)
        self.backend.raise_if_failed(comm)


class NcclBackend:
    """Collectives over one ``cupy.cuda.nccl.NcclCommunicator``."""

    name = "nccl"

    def __init__(
        self, nccl_comm: Any, rank: int, size: int, device: int, timeout: float, owner: Any = None
    ):
        import cupy
        from cupy.cuda import nccl

        self.cupy = cupy
        self.nccl = nccl
        self.comm = nccl_comm
        self.rank = rank
        self.size = size
        self.device = device
        self.timeout = timeout
        with cupy.cuda.Device(device):
            self.stream = cupy.cuda.Stream(non_blocking=True)
        self.has_avg = nccl.get_version() >= 21000
        self._in_flight: list[tuple[NcclPending, tuple]] = []
        self._lock = threading.Lock()
        self._error: CollectivesError | None = None
        self._grouped: list[NcclPending] | None = None
        self._after_group: list = []  # stream work that must follow the group's NCCL launch
        self._front: Any = None
        self._stop = threading.Event()
        self._watchdog = threading.Thread(
            target=self._watch, name="collectives-nccl-watchdog", daemon=True
        )
        self._watchdog.start()

    # ---------------------------------------------------------------- failure handling

    def _take_comm(self) -> Any:
        """Detach the NCCL communicator, once: the watchdog and the caller's thread may both
        try to abort it, and it must never be queried while it is being torn down."""
        with self._lock:
            comm, self.comm = self.comm, None
        return comm

    def fail(self, error: CollectivesError) -> None:
        """Abort the NCCL communicator once, remembering why."""
        with self._lock:
            if self._error is not None:
                return
            self._error = error
            self._in_flight.clear()
        comm = self._take_comm()
        if comm is not None:
            comm.abort()

    def raise_if_failed(self, front: Any) -> None:
        if self._error is not None:
            front._die(self._error)

    def _watch(self) -> None:
        while not self._stop.wait(WATCHDOG_PERIOD_S):
            if self._error is not None:
                return
            now = time.monotonic()
            with self._lock:
                self._in_flight = [e for e in self._in_flight if not _finished(e[0])]
                oldest = self._in_flight[0][0] if self._in_flight else None
            if oldest is not None and now - oldest.start > self.timeout:
                self.fail(timeout_error(self._front, oldest, now - oldest.start))
                return
            try:
                with self._lock:  # close() and abort() take the communicator under this lock
                    if self.comm is not None:
                        self.comm.check_async_error()
            except Exception as e:
                self.fail(CollectivesError(f"NCCL reported an asynchronous error: {e}"))
                return

    # ---------------------------------------------------------------- issuing

    def check_arrays(self, call: str, x: Any, out: Any) -> None:
        for arg, a in (("x", x), ("out", out)):
            if a is None:
                continue
            if not isinstance(a, self.cupy.ndarray):
                raise invalid(
                    call,
                    f"{arg} must be a CuPy array on device {self.device} for the "
                    f"nccl backend, got {type(a).__module__}.{type(a).__name__}",
                )
            if a.device.id != self.device:
                raise invalid(
                    call,
                    f"{arg} is on device {a.device.id}, expected device "
                    f"{self.device} (the communicator's)",
                )

    def _launch(self, arrays, issue, blocking=False) -> NcclPending:
        """Order after the caller's stream, issue the NCCL calls, record completion."""
        if self._error is not None:
            self._front._die(self._error)
        pending = NcclPending(self, blocking)
        grouped = self._grouped
        # Every call, grouped ones included: the caller may have queued more work on its
        # stream between two calls of a group (NCCL launches the group's kernels at its end).
        caller = self.cupy.cuda.get_current_stream()
        if caller.ptr != self.stream.ptr:
            self.stream.wait_event(caller.record())
        try:
            with self.cupy.cuda.Device(self.device):
                issue(self.stream.ptr)
                if grouped is None:
                    pending.event = self.stream.record()
        except Exception:
            if self._error is not None:  # aborted by the watchdog while issuing
                self._front._die(self._error)
            raise
        if grouped is not None:
            grouped.append(pending)
        with self._lock:
            self._in_flight.append((pending, arrays))
        return pending

    @staticmethod
    def _count(a: Any, name: str) -> tuple[int, int]:
        return (a.size * 2 if name in COMPLEX else a.size), NCCL_TYPE[name]

    def _op(self, op: ReduceOp) -> int:
        return NCCL_OP[ReduceOp.SUM if op is ReduceOp.AVG and not self.has_avg else op]

    def _avg_fallback(self, op: ReduceOp, out: Any) -> None:
        """NCCL before 2.10 has no ncclAvg: divide on the stream, inside the issued work."""
        if op is ReduceOp.AVG and not self.has_avg:
            from ._mpi import divide_in_place

            if self._grouped is not None:  # the reduction itself is launched at group end
                self._after_group.append(lambda: divide_in_place(out, self.size))
                return
            with self.stream:
                divide_in_place(out, self.size)

    # Each verb: (x, out, name, op, root) -> NcclPending. Everything a verb enqueues goes
    # through ``issue``, so that the completion event is recorded after all of it.

    def all_reduce(self, x, out, name, op, root):
        count, dtype = self._count(x, name)
        code = self._op(op)

        def issue(s):
            self.comm.allReduce(x.data.ptr, out.data.ptr, count, dtype, code, s)
            self._avg_fallback(op, out)

        return self._launch((x, out), issue)

    def reduce(self, x, out, name, op, root):
        count, dtype = self._count(x, name)
        code = self._op(op)
        target = x if out is None else out

        def issue(s):
            self.comm.reduce(x.data.ptr, target.data.ptr, count, dtype, code, root, s)
            if out is not None:
                self._avg_fallback(op, out)

        return self._launch((x, target), issue)

    def broadcast(self, x, out, name, op, root):
        count, dtype = self._count(x, name)
        return self._launch(
            (x,), lambda s: self.comm.broadcast(x.data.ptr, x.data.ptr, count, dtype, root, s)
        )

    def all_gather(self, x, out, name, op, root):
        count, dtype = self._count(x, name)
        return self._launch(
            (x, out), lambda s: self.comm.allGather(x.data.ptr, out.data.ptr, count, dtype, s)
        )

    def reduce_scatter(self, x, out, name, op, root):
        count, dtype = self._count(out, name)
        code = self._op(op)

        def issue(s):
            self.comm.reduceScatter(x.data.ptr, out.data.ptr, count, dtype, code, s)
            self._avg_fallback(op, out)

        return self._launch((x, out), issue)

    def all_to_all(self, x, out, name, op, root):
        in_place = out is x
        if in_place and self._grouped is not None:
            raise invalid(
                "all_to_all",
                "the in-place form (out is x) cannot run inside "
                "comm.group() on NCCL; pass a distinct out",
            )
        target = out
        if in_place:
            with self.cupy.cuda.Device(self.device):  # on out's device, whichever is current
                target = self.cupy.empty_like(out)
        count, dtype = self._count(x[0], name) if x.shape[0] else (0, NCCL_TYPE[name])

        def issue(s):
            self._grouped_p2p(
                s,
                [(x[j], j) for j in range(self.size)],
                [(target[j], j) for j in range(self.size)],
                count,
                dtype,
            )
            if in_place:
                with self.stream:
                    out[...] = target

        return self._launch((x, out, target), issue)

    def gather(self, x, out, name, op, root):
        count, dtype = self._count(x, name)
        sends, receives = [(x, root)], []
        if out is not None:
            receives = [(out[j], j) for j in range(self.size)]
            if is_slot(x, out, root):  # in place: root's own block is already there
                sends, receives = [], [(out[j], j) for j in range(self.size) if j != root]
        return self._launch((x, out), lambda s: self._grouped_p2p(s, sends, receives, count, dtype))

    def scatter(self, x, out, name, op, root):
        count, dtype = self._count(out, name)
        sends, receives = [], [(out, root)]
        if x is not None:
            sends = [(x[j], j) for j in range(self.size)]
            if is_slot(out, x, root):
                sends, receives = [(x[j], j) for j in range(self.size) if j != root], []
        return self._launch((x, out), lambda s: self._grouped_p2p(s, sends, receives, count, dtype))

    def send(self, x, out, name, op, root):
        count, dtype = self._count(x, name)
        return self._launch((x,), lambda s: self.comm.send(x.data.ptr, count, dtype, root, s))

    def recv(self, x, out, name, op, root):
        count, dtype = self._count(out, name)
        return self._launch((out,), lambda s: self.comm.recv(out.data.ptr, count, dtype, root, s))

    def barrier(self, x, out, name, op, root):
        with self.cupy.cuda.Device(self.device):
            token = self.cupy.zeros(1, self.cupy.int32)
        return self._launch(
            (token,),
            lambda s: self.comm.allReduce(
                token.data.ptr, token.data.ptr, 1, NCCL_TYPE["int32"], NCCL_OP[ReduceOp.SUM], s
            ),
            blocking=True,
        )

    def _grouped_p2p(self, stream, sends, receives, count, dtype) -> None:
        self.nccl.groupStart()
        try:
            for buf, peer in sends:
                self.comm.send(buf.data.ptr, count, dtype, peer, stream)
            for buf, peer in receives:
                self.comm.recv(buf.data.ptr, count, dtype, peer, stream)
        finally:
            self.nccl.groupEnd()

    # ---------------------------------------------------------------- groups and lifetime

    def group_start(self) -> None:
        self._grouped = []
        self._after_group = []
        self.nccl.groupStart()

    def group_end(self, pendings: list) -> None:
        grouped, self._grouped = self._grouped or [], None
        after, self._after_group = self._after_group, []
        with self.cupy.cuda.Device(self.device):
            self.nccl.groupEnd()
            with self.stream:
                for work in after:
                    work()
            event = self.stream.record()
        for pending in grouped:
            pending.event = event

    def split(self, child_mpi: Any, color: int | None, key: int) -> tuple[Any, dict]:
        split = getattr(self.comm, "commSplit", None)
        if split is not None:
            child = split(-1 if color is None else color, key)
        elif child_mpi is not None and child_mpi != _comm_null():
            child = bootstrap_nccl(child_mpi, self.device)
        else:
            child = None
        if child is None:
            return None, {}
        size, rank = child_mpi.Get_size(), child_mpi.Get_rank()
        impl = NcclBackend(child, rank, size, self.device, self.timeout)
        return impl, {"device": self.device, "stream": impl.stream}

    def close(self) -> None:
        """Destroy once the work in flight has finished; abort if it has not within the
        timeout (a peer that never arrives must not hang ``close``)."""
        self._stop.set()
        comm = self._take_comm()
        if comm is None:
            return
        with self.cupy.cuda.Device(self.device):
            drained = self.stream.record()
        deadline = time.monotonic() + self.timeout
        while not drained.done:
            if time.monotonic() > deadline:
                comm.abort()
                return
            time.sleep(1e-3)
        comm.destroy()

    def abort(self) -> None:
        self._stop.set()
        comm = self._take_comm()
        if comm is not None:
            comm.abort()

    def attach(self, front: Any) -> None:
        """Give the watchdog the front end, for the messages it writes."""
        self._front = front


def _finished(pending: NcclPending) -> bool:
    event = pending.event
    return event is not None and event.done


def _comm_null():
    from mpi4py import MPI

    return MPI.COMM_NULL


def bootstrap_nccl(mpi_comm: Any, device: int) -> Any:
    """Create an NcclCommunicator over ``mpi_comm``'s ranks: rank 0 makes the unique id
    (bytes on CuPy 14, a tuple on CuPy 13), MPI broadcasts it, every rank joins."""
    import cupy
    from cupy.cuda import nccl

    uid = nccl.get_unique_id() if mpi_comm.Get_rank() == 0 else None
    uid = mpi_comm.bcast(uid, root=0)
    with cupy.cuda.Device(device):
        return nccl.NcclCommunicator(mpi_comm.Get_size(), uid, mpi_comm.Get_rank())


def make_nccl_backend(mpi_comm: Any, device: int | None, local_rank: int, timeout: float):
    """The backend and the Communicator's extra fields for a fresh NCCL communicator."""
    import cupy

    count = cupy.cuda.runtime.getDeviceCount()
    device = local_rank % count if device is None else device
    if not 0 <= device < count:
        raise invalid("init", f"device must be in [0, {count}), got {device}")
    cupy.cuda.Device(device).use()
    try:
        nccl_comm = bootstrap_nccl(mpi_comm, device)
    except Exception as e:
        raise BackendUnavailableError(f"init: NCCL communicator creation failed: {e}") from e
    impl = NcclBackend(nccl_comm, mpi_comm.Get_rank(), mpi_comm.Get_size(), device, timeout)
    return impl, {"device": device, "stream": impl.stream}
