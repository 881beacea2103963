"""``cupy.cuda.runtime``: the calls of CUDA's runtime the project makes, emulated."""

from __future__ import annotations

from typing import Any

from . import _gpu
from ._gpu import CUDARuntimeError
from ._objects import event_query

__all__ = [
    "CUDARuntimeError",
    "eventQuery",
    "getDevice",
    "getDeviceCount",
    "getDeviceProperties",
    "setDevice",
    "is_hip",
    "driverGetVersion",
    "runtimeGetVersion",
    "deviceSynchronize",
]

is_hip = False


def getDeviceCount() -> int:
    return _gpu.device_count()


def getDevice() -> int:
    return _gpu.current_device()


def setDevice(device: int) -> None:
    """``cudaSetDevice``: an id outside the visible devices is cudaErrorInvalidDevice (101)."""
    _gpu.set_current_device(device)


def runtimeGetVersion() -> int:
    return 13000


def driverGetVersion() -> int:
    return 13000


def eventQuery(event: int) -> int:
    return event_query(event)


def deviceSynchronize() -> None:
    from ._objects import Device

    Device().synchronize()


def getDeviceProperties(device: int) -> dict[str, Any]:
    _gpu.check_device(device)
    return {
        "name": b"Emulated GPU (CPU memory)",
        "uuid": bytes([0xE0, device]) + bytes(14),
        "totalGlobalMem": 80 << 30,
        "major": 9,
        "minor": 0,
        "multiProcessorCount": 132,
        "pciBusID": 0x18 + 0x10 * device,
        "pciDeviceID": 0,
        "pciDomainID": 0,
    }
