"""The device side of the NCCL backend: whether NCCL is usable, which GPU a rank takes, each
communicator's stream, completion events, and creating a communicator.
"""

from __future__ import annotations

import functools
import os
import socket
import threading
from typing import Any

from .._core.backend import Bootstrap
from .._errors import InvalidArgumentError
from .rules import event_query_done


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


def new_stream(device: int) -> Any:
    """A stream of its own for one communicator on ``device``: a call stuck on one
    communicator then holds up that communicator's later calls only, never another's."""
    import cupy

    with cupy.cuda.Device(device):  # a Stream belongs to the device current at creation
        return cupy.cuda.Stream(non_blocking=True)


def ordering_stream(device: int) -> Any:
    """This thread's stream on ``device`` for ordering calls made on several communicators
    one after another (each communicator has its own stream: nothing else orders them)."""
    streams = _ORDERING.__dict__.setdefault("by_device", {})
    if device not in streams:
        streams[device] = new_stream(device)
    return streams[device]


_ORDERING = threading.local()


def finished(pending: Any) -> bool:
    """Whether a call's completion event is recorded and has completed."""
    event = pending.event
    return event is not None and event_done(event)


def event_done(event: Any) -> bool:
    """Whether a ``cupy.cuda.Event`` has completed. CuPy's ``Event.done`` is
    ``eventQuery(ptr) == 0``, which after a kernel fault says "not yet" for ever; this
    raises ``CUDARuntimeError`` for a status other than success or not-ready."""
    runtime = _runtime()
    return event_query_done(runtime.eventQuery(event.ptr), runtime.CUDARuntimeError)


@functools.cache
def _runtime() -> Any:
    """``cupy.cuda.runtime``, imported on first use (an import statement per query costs
    more than the query)."""
    from cupy.cuda import runtime

    return runtime


def use_device(device: int) -> int:
    """Make ``device`` this thread's current one; the one that was (for :func:`restore_device`).
    As ``with cupy.cuda.Device(device)`` does, without its objects: a device already current
    is not set again."""
    runtime = _runtime()
    previous = runtime.getDevice()
    if previous != device:
        runtime.setDevice(device)
    return previous


def restore_device(previous: int, device: int) -> None:
    """Make ``previous`` current again where :func:`use_device` changed it."""
    if previous != device:
        _runtime().setDevice(previous)


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
    what :func:`collectives._nccl.rules.shared_gpu_reason` decides from."""
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
