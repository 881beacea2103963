"""Host-side numerics shared by the backends and the layers above: bfloat16 rounding and
AVG's division. Each works on NumPy and on CuPy arrays alike.

bfloat16 is the top half of a float32. Rounding float32 to bfloat16 is round-to-nearest-even
on the dropped 16 bits; infinities stay infinities, finite values past bfloat16's largest
round to infinity, and a NaN stays a NaN: the quiet bit is set and the sign and the top of
the payload are kept (rounding would carry a NaN's payload into the exponent).
"""

from __future__ import annotations

from typing import Any, Callable

from ._arrays import array_module


def divide_in_place(out: Any, size: int) -> None:
    """AVG's division; integers truncate toward zero, as NCCL's ncclAvg does."""
    if out.dtype.kind in "fc":
        out /= size
    else:
        # Floor division corrected toward zero (abs() would overflow the minimum integer).
        quotient = out // size
        quotient += ((out % size) != 0) & (out < 0)
        out[...] = quotient


def bfloat16_to_float32(bits: Any) -> Any:
    """The float32 values of bfloat16 bits held in a uint16 array (exact).

    Example:
        >>> bfloat16_to_float32(np.array([0x3F80], np.uint16))
        array([1.], dtype=float32)
    """
    xp = array_module(bits)
    wide = bits.astype(xp.uint32)
    wide <<= 16  # in place, so that a 0-d array stays an array (a writable buffer)
    return wide.view(xp.float32)


def float32_to_bfloat16(values: Any, out: Any = None) -> Any:
    """Round float32 ``values`` to bfloat16 bits (round to nearest even; NaN stays a quiet
    NaN), written into the uint16 array ``out`` (a new one if None), which is returned.

    Example:
        >>> float32_to_bfloat16(np.array([1.0, np.nan], np.float32))
        array([16256, 32704], dtype=uint16)
    """
    xp = array_module(values)
    if out is None:
        out = xp.empty(values.shape, xp.uint16)
    flat = values.reshape(-1)  # 1-d: arithmetic on a 0-d array gives scalars, not arrays
    bits = flat.view(xp.uint32)
    # In place on two uint32 temporaries: fresh large temporaries cost page faults, and this
    # measured 5x faster than the same arithmetic written as expressions.
    high = bits >> 16
    rounded = high & 1
    rounded += bits  # only NaN patterns can pass 2**32 - 1, and they are replaced below
    rounded += 0x7FFF
    rounded >>= 16
    high |= 0x0040
    xp.copyto(rounded, high, where=flat != flat)
    out[...] = rounded.reshape(values.shape)
    return out


def float32_copies(x: Any, out: Any) -> tuple[Any, Any, Callable[[], None]]:
    """float32 copies of ``x`` and ``out`` (one copy where ``out`` is ``x``), and the step that
    rounds the copy of ``out`` back into ``out``."""
    wide_x = x.astype(array_module(x).float32)
    wide_out = wide_x if out is x else out.astype(wide_x.dtype)

    def narrow() -> None:
        out[...] = wide_out

    return wide_x, wide_out, narrow
