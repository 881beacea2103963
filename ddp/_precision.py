"""Half-precision parameters seen through their float32 master copies.

Three kinds of half-precision arrays are accepted: float16, ``ml_dtypes.bfloat16`` NumPy
arrays, and uint16 bfloat16 bits declared with ``collectives.as_bfloat16`` (CuPy has no
bfloat16 dtype). The optimizers update a float32 master and round it back into the half
array, so that updates smaller than half a unit of the half precision are not lost.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from collectives import BFloat16Array, array_module, bfloat16_to_float32, float32_to_bfloat16


def is_half(x: Any) -> bool:
    """True for float16, ml_dtypes bfloat16 and ``as_bfloat16`` bits."""
    if isinstance(x, BFloat16Array):
        return True
    dtype = getattr(x, "dtype", None)
    return dtype is not None and (dtype == np.float16 or dtype.name == "bfloat16")


def storage(x: Any) -> Any:
    """The array holding ``x``'s elements (the uint16 bits of an ``as_bfloat16`` array)."""
    return x.array if isinstance(x, BFloat16Array) else x


def to_float32(x: Any) -> Any:
    """A new float32 array with the values of ``x`` (exact for every half kind)."""
    if isinstance(x, BFloat16Array):
        return bfloat16_to_float32(x.array)
    return x.astype(np.float32)


def round_into(dst: Any, values: Any) -> None:
    """Write float32 ``values`` into the half array ``dst``, rounded to nearest even."""
    if isinstance(dst, BFloat16Array):
        float32_to_bfloat16(array_module(values).ascontiguousarray(values), out=dst.array)
    else:
        dst[...] = values


def wrap_like(model: Any, array: Any) -> Any:
    """``array`` (storage) declared the way ``model`` is: as_bfloat16 bits stay declared."""
    return BFloat16Array(array) if isinstance(model, BFloat16Array) else array


def dtype_label(x: Any) -> str:
    """'bfloat16' for as_bfloat16 bits, else the dtype's name."""
    return "bfloat16" if isinstance(x, BFloat16Array) else str(x.dtype)
