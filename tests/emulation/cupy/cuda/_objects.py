"""``cupy.cuda.Device``, ``Stream``, ``ExternalStream``, ``Event`` and the current stream,
with CuPy 14's signatures, over the emulated devices of :mod:`._gpu`."""

from __future__ import annotations

import threading
import weakref
from typing import Any

from . import _gpu
from ._gpu import CUDARuntimeError, Queue


class Device:
    """``cupy.cuda.Device(device=None)``: the current device when None."""

    def __init__(self, device: Any = None):
        self.id = _gpu.current_device() if device is None else int(device)
        self._previous: list[int] = []

    def use(self) -> None:
        _gpu.set_current_device(self.id)

    def __enter__(self) -> Device:
        self._previous.append(_gpu.current_device())
        self.use()
        return self

    def __exit__(self, *exc: Any) -> None:
        _gpu.set_current_device(self._previous.pop())

    def synchronize(self) -> None:
        _gpu.check_device(self.id)
        for queue in _queues_of(self.id):
            queue.drain()
        _gpu.raise_if_faulted(self.id)

    @property
    def pci_bus_id(self) -> str:
        _gpu.check_device(self.id)
        return f"0000:{0x18 + 0x10 * self.id:02X}:00.0"

    @property
    def compute_capability(self) -> str:
        return "90"

    @property
    def mem_info(self) -> tuple[int, int]:
        return (80 << 30, 80 << 30)

    def __int__(self) -> int:
        return self.id

    __index__ = __int__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Device) and other.id == self.id

    def __hash__(self) -> int:
        return hash(("Device", self.id))

    def __repr__(self) -> str:
        return f"<CUDA Device {self.id}>"


_ALL_QUEUES: weakref.WeakSet = weakref.WeakSet()
_NULL_QUEUES: dict[int, Queue] = {}
_NULL_LOCK = threading.Lock()


def _queues_of(device: int) -> list[Queue]:
    return [q for q in list(_ALL_QUEUES) if q.device == device]


def _null_queue(device: int) -> Queue:
    with _NULL_LOCK:
        queue = _NULL_QUEUES.get(device)
        if queue is None:
            queue = _NULL_QUEUES[device] = Queue(device, f"null-{device}")
            _ALL_QUEUES.add(queue)
        return queue


class _BaseStream:
    ptr: int
    _queue_of_device: Queue | None

    @property
    def device_id(self) -> int:
        return self._queue().device

    def _queue(self) -> Queue:
        if self._queue_of_device is None:  # the null stream: the current device's
            return _null_queue(_gpu.current_device())
        return self._queue_of_device

    def __enter__(self) -> Any:
        device = self.device_id
        stack = _stream_stack(device)
        stack.append(current_stream(device))
        _set_current(device, self)
        return self

    def __exit__(self, *exc: Any) -> None:
        device = self.device_id
        _set_current(device, _stream_stack(device).pop())

    def use(self) -> Any:
        _set_current(self.device_id, self)
        return self

    def record(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        _gpu.raise_if_faulted(self.device_id)
        ticket = event._ticket
        if ticket is not None and not ticket.done:
            self._queue().put("wait", ticket)

    def synchronize(self) -> None:
        queue = self._queue()
        _gpu.raise_if_faulted(queue.device)
        queue.drain()
        _gpu.raise_if_faulted(queue.device)

    @property
    def done(self) -> bool:
        _gpu.raise_if_faulted(self.device_id)
        return self._queue().idle()

    def is_capturing(self) -> bool:
        return self._queue().capture is not None

    def begin_capture(self, mode: Any = None) -> None:
        if self.ptr == 0:
            raise CUDARuntimeError(400)  # the legacy stream cannot capture
        self._queue().capture = []

    def end_capture(self) -> Any:
        queue = self._queue()
        kernels, queue.capture = queue.capture or [], None
        return _Graph(kernels)

    def launch(self, work: Any) -> None:
        """Queue ``work`` (a Python callable standing for a kernel) on this stream."""
        queue = self._queue()
        _gpu.raise_if_faulted(queue.device)
        queue.put("work", work)

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, _BaseStream)
            and other.ptr == self.ptr
            and (other.device_id == self.device_id)
        )

    def __hash__(self) -> int:
        return hash(("Stream", self.ptr))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.ptr:#x} (device {self.device_id})>"


class _Graph:
    """A captured graph: its kernels, queued again on each launch."""

    def __init__(self, kernels: list):
        self._kernels = kernels

    def launch(self, stream: Any = None) -> None:
        stream = current_stream() if stream is None else stream
        for kernel in self._kernels:
            stream.launch(kernel)


class Stream(_BaseStream):
    """``cupy.cuda.Stream(null=False, non_blocking=False, ptds=False, priority=None)``."""

    null: Stream

    def __init__(
        self, null: bool = False, non_blocking: bool = False, ptds: bool = False,
        priority: int | None = None,
    ):  # fmt: skip
        if null:
            self.ptr, self._queue_of_device = 0, None
            return
        device = _gpu.current_device()
        _gpu.check_device(device)
        self.ptr = _gpu.new_handle()
        self._queue_of_device = Queue(device, f"{self.ptr:#x}")
        _ALL_QUEUES.add(self._queue_of_device)
        _STREAMS_BY_PTR[self.ptr] = self


Stream.null = Stream(null=True)


class ExternalStream(_BaseStream):
    """``cupy.cuda.ExternalStream(ptr, device_id=-1)``: a stream made elsewhere, by its
    handle (one of this emulation's streams)."""

    def __init__(self, ptr: int, device_id: int = -1):
        self.ptr = int(ptr)
        found = _STREAMS_BY_PTR.get(self.ptr)
        self._queue_of_device = None if found is None else found._queue_of_device


_STREAMS_BY_PTR: weakref.WeakValueDictionary = weakref.WeakValueDictionary()

_LOCAL = threading.local()


def _current_streams() -> dict[int, Any]:
    streams = getattr(_LOCAL, "streams", None)
    if streams is None:
        streams = _LOCAL.streams = {}
    return streams


def _stream_stack(device: int) -> list:
    stacks = getattr(_LOCAL, "stacks", None)
    if stacks is None:
        stacks = _LOCAL.stacks = {}
    return stacks.setdefault(device, [])


def _set_current(device: int, stream: Any) -> None:
    _current_streams()[device] = stream


def current_stream(device_id: int | None = None) -> Any:
    """``cupy.cuda.get_current_stream(device_id=None)``: this thread's current stream on the
    device (the null stream until one is made current)."""
    device = _gpu.current_device() if device_id is None else int(device_id)
    return _current_streams().get(device, Stream.null)


class Event:
    """``cupy.cuda.Event(block=False, disable_timing=False, interprocess=False)``."""

    def __init__(self, block: bool = False, disable_timing: bool = False,
                 interprocess: bool = False):  # fmt: skip
        self.ptr = _gpu.new_handle()
        self.disable_timing = disable_timing
        self._device = _gpu.current_device()
        self._ticket: _gpu.Ticket | None = None
        _EVENTS[self.ptr] = self

    def record(self, stream: Any = None) -> None:
        stream = current_stream() if stream is None else stream
        _gpu.raise_if_faulted(stream.device_id)
        self._ticket = stream._queue().record()

    def synchronize(self) -> None:
        if self._ticket is not None:
            self._ticket.wait()
        _gpu.raise_if_faulted(self._device)

    @property
    def done(self) -> bool:
        return event_query(self.ptr) == 0


_EVENTS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def event_query(ptr: int) -> int:
    """``cudaEventQuery``: 0 (complete or never recorded), 600 (not yet) or the device's
    sticky error."""
    event = _EVENTS.get(ptr)
    if event is None:
        return 400
    status = _gpu.sticky_error(event._device)
    if status:
        return status
    ticket = event._ticket
    return 0 if ticket is None or ticket.done else _gpu.NOT_READY


def elapsed_time(start: Event, end: Event) -> float:
    """``cupy.cuda.get_elapsed_time(start, end)`` in milliseconds."""
    if start.disable_timing or end.disable_timing:
        raise CUDARuntimeError(400)
    for event in (start, end):
        if event._ticket is None:
            raise CUDARuntimeError(400)
        if not event._ticket.done:
            raise CUDARuntimeError(600)
    return (end._ticket.time - start._ticket.time) * 1e3  # type: ignore[union-attr,operator]
