"""``cupy.ElementwiseKernel`` and ``cupy.RawKernel``: CUDA C cannot run on the emulated
devices, so a kernel runs the Python stand-in registered under its name (:data:`KERNELS`),
and one without a stand-in is refused when it is made."""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from .cuda import _gpu
from .cuda._objects import current_stream


def _bucket_copy(direction: str) -> Callable[..., None]:
    """ddp/_pack.py's kernels: gather (``pack``) or scatter (``unpack``) the tensors whose
    device pointers and element offsets are given, into or out of ``y``."""

    def run(ptrs: Any, offsets: Any, n_tensors: int, y: Any) -> None:
        device = y._mem.device
        pointers, starts = ptrs._a.tolist(), offsets._a.tolist()
        flat = y._a.reshape(-1)
        ends = starts[1:] + [flat.size]
        for ptr, start, end in zip(pointers[:n_tensors], starts, ends):
            count = end - start
            memory = _gpu.device_bytes(
                ptr, count * flat.itemsize, device, "ddp_bucket_" + direction
            )
            tensor = memory.view(flat.dtype)
            if direction == "pack":
                flat[start:end] = tensor
            else:
                tensor[...] = flat[start:end]

    return run


def _spin(cycles: Any) -> None:
    """tests' ``spin`` kernel: busy for ``cycles`` clock ticks (1.4 GHz)."""
    time.sleep(int(cycles) / 1.4e9)


#: kernel name -> Python stand-in taking the kernel's arguments (device arrays as they are)
KERNELS: dict[str, Callable[..., None]] = {
    "ddp_bucket_pack": _bucket_copy("pack"),
    "ddp_bucket_unpack": _bucket_copy("unpack"),
    "spin": _spin,
}


def _stand_in(name: str) -> Callable[..., None]:
    if name not in KERNELS:
        raise NotImplementedError(
            f"kernel {name!r} is CUDA C, which the emulated CuPy cannot run: register a Python "
            "stand-in in tests/emulation/cupy/_kernels.py KERNELS"
        )
    return KERNELS[name]


class ElementwiseKernel:
    """``cupy.ElementwiseKernel(in_params, out_params, operation, name='kernel', ...)``: runs
    in order on the current stream; the host waits (its output is read right after)."""

    def __init__(self, in_params: str, out_params: str, operation: str, name: str = "kernel",
                 **options: Any):  # fmt: skip
        self.name = name
        self._run = _stand_in(name)

    def __call__(self, *args: Any, size: Any = None, stream: Any = None, **kw: Any) -> None:
        device = _gpu.current_device()
        queue = (stream or current_stream(device))._queue()
        _gpu.run_on(queue, lambda: self._run(*args))


class RawKernel:
    """``cupy.RawKernel(code, name, ...)``: ``kernel(grid, block, args)`` is queued on the
    current stream and the host goes on."""

    def __init__(self, code: str, name: str, options: Any = (), backend: str = "nvrtc",
                 **kw: Any):  # fmt: skip
        self.name = name
        self._run = _stand_in(name)

    def __call__(self, grid: Any, block: Any, args: tuple, *, shared_mem: int = 0,
                 stream: Any = None, **kw: Any) -> None:  # fmt: skip
        stream = stream or current_stream()
        values = [np.asarray(a).item() if isinstance(a, np.generic) else a for a in args]
        stream.launch(lambda: self._run(*values))
