"""An emulation of CuPy 14.2 on the CPU, for the tests of the NCCL backend where no GPU is.

Never imported by the library, and never put before a real CuPy: ``tests/emulation`` goes
on ``PYTHONPATH`` only where ``cupy`` cannot be imported otherwise (tests/emulation/README.md
says what it shows and what it cannot). Arrays live in host memory registered to emulated
devices; NumPy does the arithmetic; ``cupy.cuda.nccl`` moves data between processes.
"""

from __future__ import annotations

import importlib.machinery as _machinery
import os as _os
import sys as _sys
from typing import Any

import numpy as _np


def _refuse_to_shadow() -> None:
    here = _os.path.dirname(_os.path.dirname(_os.path.abspath(__file__)))
    rest = [p for p in _sys.path if _os.path.abspath(p or ".") != here]
    real = _machinery.PathFinder.find_spec("cupy", rest)
    if real is not None:
        raise ImportError(
            f"the emulated CuPy ({here}) would hide a real one ({real.origin}): take "
            "tests/emulation off the import path"
        )


_refuse_to_shadow()  # before anything of the emulation loads

from . import cuda  # noqa: E402
from ._core import (  # noqa: E402
    asnumpy,
    empty,
    empty_like,
    from_host,
    from_interface,
    module_attribute,
    ndarray,
)
from ._kernels import ElementwiseKernel, RawKernel  # noqa: E402

__version__ = "14.2.0"
EMULATED = True

__all__ = [
    "ElementwiseKernel",
    "RawKernel",
    "asnumpy",
    "cuda",
    "empty",
    "empty_like",
    "from_dlpack",
    "get_array_module",
    "ndarray",
]


def from_dlpack(array: Any, *, device: Any = None, copy: Any = None) -> ndarray:
    """A zero-copy view of another library's device array (its CUDA array interface)."""
    if isinstance(array, ndarray):
        return array
    if hasattr(array, "__cuda_array_interface__"):
        return from_interface(array.__cuda_array_interface__)
    kind = array.__dlpack_device__()[0] if hasattr(array, "__dlpack_device__") else None
    raise BufferError(f"the emulated CuPy imports CUDA memory only (DLPack device type {kind})")


def get_array_module(*args: Any) -> Any:
    import sys

    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else _np


def asarray(a: Any, dtype: Any = None, order: Any = None, *, blocking: bool = False) -> ndarray:
    return from_host(a, dtype, order, copy=False)


def array(obj: Any, dtype: Any = None, copy: bool = True, order: str = "K", subok: bool = False,
          ndmin: int = 0, *, blocking: bool = False) -> ndarray:  # fmt: skip
    result = from_host(obj, dtype, order, copy=copy)
    return (
        result.reshape((1,) * (ndmin - result.ndim) + result.shape)
        if ndmin > result.ndim
        else result
    )


def __getattr__(name: str) -> Any:
    value = module_attribute(_np, name)
    globals()[name] = value
    return value
