"""``cupy.cuda`` of the emulated CuPy: devices, streams, events, the runtime and NCCL."""

from __future__ import annotations

from typing import Any

from . import runtime
from ._gpu import CUDARuntimeError
from ._objects import Device, Event, ExternalStream, Stream, current_stream, elapsed_time

__all__ = [
    "CUDARuntimeError",
    "Device",
    "Event",
    "ExternalStream",
    "Stream",
    "get_current_stream",
    "get_elapsed_time",
    "is_available",
    "nccl",
    "runtime",
]


def get_current_stream(device_id: int | None = None) -> Any:
    return current_stream(device_id)


def get_elapsed_time(start_event: Event, end_event: Event) -> float:
    return elapsed_time(start_event, end_event)


def is_available() -> bool:
    return runtime.getDeviceCount() > 0


def __getattr__(name: str) -> Any:
    if name == "nccl":  # imported on first use, as CuPy loads libnccl lazily
        import importlib

        return importlib.import_module(f"{__name__}.nccl")
    if name == "MemoryPointer":
        from .._core import MemoryPointer

        return MemoryPointer
    raise AttributeError(f"module 'cupy.cuda' has no attribute {name!r}")
