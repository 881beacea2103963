"""Emulated devices: device memory, the per-thread current device, streams and events.

A device is a number in ``[0, EMULATED_CUPY_DEVICES)``. Its memory is host memory that was
allocated for it and is registered under its address, so a raw pointer (``a.data.ptr``)
can be resolved back to the bytes it names and to the device that owns them, or fault as
CUDA would. A stream is an ordered queue run by a thread of its own; an event is a point in
one stream's queue. What a host thread computes on arrays runs "on" its current stream: after
everything already queued there (see :func:`run_on`).
"""

from __future__ import annotations

import bisect
import itertools
import os
import sys
import threading
import time
import weakref
from collections import deque
from typing import Any, Callable

import numpy as np

#: CUDA runtime statuses the emulation can produce: (name, message), as cudaGetErrorName and
#: cudaGetErrorString give them.
CUDA_STATUS = {
    0: ("cudaSuccess", "no error"),
    1: ("cudaErrorInvalidValue", "invalid argument"),
    2: ("cudaErrorMemoryAllocation", "out of memory"),
    100: ("cudaErrorNoDevice", "no CUDA-capable device is detected"),
    101: ("cudaErrorInvalidDevice", "invalid device ordinal"),
    400: ("cudaErrorInvalidResourceHandle", "invalid resource handle"),
    600: ("cudaErrorNotReady", "device not ready"),
    700: ("cudaErrorIllegalAddress", "an illegal memory access was encountered"),
    719: ("cudaErrorLaunchFailure", "unspecified launch failure"),
}
NOT_READY = 600
ILLEGAL_ADDRESS = 700


class CUDARuntimeError(RuntimeError):
    """As ``cupy_backends.cuda.api.runtime.CUDARuntimeError``: ``status`` and
    ``"<name>: <message>"``."""

    def __init__(self, status: int):
        self.status = status
        name, message = CUDA_STATUS.get(status, (f"cudaError{status}", "unknown error"))
        super().__init__(f"{name}: {message}")

    def __reduce__(self) -> tuple:
        return (type(self), (self.status,))


def device_count() -> int:
    """``EMULATED_CUPY_DEVICES`` (default 1): the GPUs of this emulated node."""
    return int(os.environ.get("EMULATED_CUPY_DEVICES", "1"))


def launch_delay() -> float:
    """``EMULATED_CUPY_DELAY`` seconds (default 0) that each queued launch waits before it
    runs: a stream or event wait that is missing shows as a wrong result."""
    return float(os.environ.get("EMULATED_CUPY_DELAY", "0"))


def check_device(device: int) -> int:
    device = int(device)
    if not 0 <= device < device_count():
        raise CUDARuntimeError(101)
    return device


# ---------------------------------------------------------------- the current device

_LOCAL = threading.local()


def current_device() -> int:
    """This thread's current device: 0 until the thread makes another current (CUDA's
    current device is per host thread)."""
    return getattr(_LOCAL, "device", 0)


def set_current_device(device: int) -> None:
    _LOCAL.device = check_device(device)


# ---------------------------------------------------------------- sticky errors

_STICKY: dict[int, int] = {}


def sticky_error(device: int) -> int:
    """The error that corrupted ``device``'s context (0: none). After a fault every later
    call on that device fails with it, as CUDA's sticky errors do."""
    return _STICKY.get(device, 0)


def fault(device: int, status: int = ILLEGAL_ADDRESS) -> None:
    _STICKY.setdefault(device, status)
    with _TICKETS:
        _TICKETS.notify_all()


def raise_if_faulted(device: int) -> None:
    status = sticky_error(device)
    if status:
        raise CUDARuntimeError(status)


class Fault(Exception):
    """Raised inside a queued launch: the device faults with ``status``."""

    def __init__(self, status: int, why: str):
        super().__init__(why)
        self.status = status


# ---------------------------------------------------------------- device memory

_GARBAGE = itertools.cycle(range(0x51, 0xFF, 7))


class Memory:
    """One allocation of ``device``: host bytes registered under their address.

    ``buffer`` is the NumPy array that owns the bytes; ``bytes`` a flat uint8 view of them.
    """

    def __init__(self, device: int, buffer: np.ndarray):
        self.device = device
        self.buffer = buffer
        self.bytes = buffer.reshape(-1, order="A").view(np.uint8)  # memory order, no copy
        self.ptr = int(buffer.__array_interface__["data"][0]) if buffer.nbytes else 0
        self.size = buffer.nbytes
        if self.size:
            _register(self)
            _on_free(self)


def allocate(nbytes: int, device: int | None = None) -> Memory:
    """Fresh memory of ``device`` (the current one by default), not zeroed: it holds a
    byte pattern, as reused memory of CuPy's pool holds whatever was there."""
    device = current_device() if device is None else device
    raise_if_faulted(device)
    raw = np.empty(max(int(nbytes), 0) + 256, np.uint8)
    start = (-raw.__array_interface__["data"][0]) % 256  # CUDA allocations are aligned
    buffer = raw[start : start + int(nbytes)]
    buffer.fill(next(_GARBAGE))
    memory = Memory.__new__(Memory)
    memory.device, memory.buffer, memory.bytes = device, raw, buffer
    memory.ptr = int(buffer.__array_interface__["data"][0]) if nbytes else 0
    memory.size = int(nbytes)
    if memory.size:
        _register(memory)
        _on_free(memory)
    return memory


def _on_free(memory: Memory) -> None:
    # Not at interpreter exit: device memory lives as long as the process, and a stream may
    # still run a launch on it then (CUDA keeps it until the context goes).
    weakref.finalize(memory, _unregister, memory.ptr).atexit = False


_ALLOCATIONS: dict[int, tuple[int, weakref.ref]] = {}
_STARTS: list[int] = []
_ALLOCATIONS_LOCK = threading.Lock()


def _register(memory: Memory) -> None:
    with _ALLOCATIONS_LOCK:
        _ALLOCATIONS[memory.ptr] = (memory.size, weakref.ref(memory))
        bisect.insort(_STARTS, memory.ptr)


def _unregister(ptr: int) -> None:
    with _ALLOCATIONS_LOCK:
        if _ALLOCATIONS.pop(ptr, None) is not None:
            i = bisect.bisect_left(_STARTS, ptr)
            if i < len(_STARTS) and _STARTS[i] == ptr:
                del _STARTS[i]


def find(ptr: int) -> tuple[Memory, int] | None:
    """The live allocation holding address ``ptr`` and the offset into it, or None."""
    with _ALLOCATIONS_LOCK:
        i = bisect.bisect_right(_STARTS, ptr) - 1
        if i < 0:
            return None
        start = _STARTS[i]
        size, ref = _ALLOCATIONS[start]
    memory = ref()
    if memory is None or ptr >= start + size:
        return None
    return memory, ptr - start


def device_bytes(ptr: int, nbytes: int, device: int, what: str) -> np.ndarray:
    """The ``nbytes`` bytes at ``ptr``, which must be memory of ``device``: else the launch
    faults (``cudaErrorIllegalAddress``), as a kernel given such a pointer would."""
    if nbytes == 0:
        return np.empty(0, np.uint8)
    found = find(ptr)
    if found is None:
        raise Fault(ILLEGAL_ADDRESS, f"{what}: {ptr:#x} is not device memory")
    memory, offset = found
    if memory.device != device:
        raise Fault(
            ILLEGAL_ADDRESS, f"{what}: {ptr:#x} is memory of device {memory.device}, not {device}"
        )
    if offset + nbytes > memory.size:
        raise Fault(ILLEGAL_ADDRESS, f"{what}: {nbytes} bytes at {ptr:#x} overrun the allocation")
    return memory.bytes[offset : offset + nbytes]


# ---------------------------------------------------------------- streams and events

_TICKETS = threading.Condition()
_HANDLES = itertools.count(0x7F0000001000, 0x100)


def new_handle() -> int:
    return next(_HANDLES)


class Ticket:
    """A point in a queue: done once everything queued before it has run."""

    __slots__ = ("done", "time", "device")

    def __init__(self, device: int, done: bool = False):
        self.device = device
        self.done = done
        self.time = time.perf_counter() if done else None

    def complete(self) -> None:
        with _TICKETS:
            self.done, self.time = True, time.perf_counter()
            _TICKETS.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Until done (or the device faulted, or ``timeout`` seconds passed): whether done."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with _TICKETS:
            while not self.done and not sticky_error(self.device):
                if deadline is not None and time.monotonic() >= deadline:
                    break
                _TICKETS.wait(0.05)
        return self.done


class Queue:
    """One stream's work, run in order by a thread of its own (started at the first launch).

    Items are ``("work", fn)``, ``("record", ticket)`` and ``("wait", ticket)``.
    """

    def __init__(self, device: int, name: str):
        self.device = device
        self.name = name
        self._items: deque = deque()
        self._running = False
        self._thread: threading.Thread | None = None
        self._cv = threading.Condition()
        self.capture: list | None = None  # the kernels of a CUDA graph being captured

    def idle(self) -> bool:
        with self._cv:
            return not self._items and not self._running

    def put(self, kind: str, value: Any) -> None:
        with self._cv:
            self._items.append((kind, value))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name=f"emulated-stream-{self.name}", daemon=True
                )
                self._thread.start()
            self._cv.notify_all()

    def record(self) -> Ticket:
        with self._cv:
            if not self._items and not self._running:
                return Ticket(self.device, done=True)
        ticket = Ticket(self.device)
        self.put("record", ticket)
        return ticket

    def drain(self) -> None:
        """Block until everything queued has run (or the device has faulted)."""
        if self.idle():
            return
        self.record().wait()

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._items:
                    self._cv.wait()
                kind, value = self._items.popleft()
                self._running = True
            try:
                self._one(kind, value)
            finally:
                with self._cv:
                    self._running = False

    def _one(self, kind: str, value: Any) -> None:
        if kind == "record":
            value.complete()
        elif kind == "wait":
            value.wait()
        elif not sticky_error(self.device):  # a faulted context runs nothing more
            delay = launch_delay()
            if delay:
                time.sleep(delay)
            try:
                value()
            except Fault as e:
                sys.stderr.write(f"emulated CUDA: device {self.device}: {e}\n")
                fault(self.device, e.status)
            except Exception as e:  # a launch that cannot run is a fault, never silent
                sys.stderr.write(f"emulated CUDA: device {self.device}: {type(e).__name__}: {e}\n")
                fault(self.device, 719)


def run_on(queue: Queue, work: Callable[[], Any]) -> Any:
    """Run ``work`` now in this thread, as a kernel on ``queue``'s stream whose result the
    host waits for: after everything already queued there."""
    raise_if_faulted(queue.device)
    if queue.capture is not None:  # captured into a graph, not run
        queue.capture.append(work)
        return None
    queue.drain()
    raise_if_faulted(queue.device)
    return work()
