"""NaN through NCCL's max and min.

NCCL reduces floats with ``fmaxf``/``fminf`` (src/device/reduce_kernel.h), where a number wins
over a NaN; NumPy's ``maximum`` and the MPI backend propagate the NaN. So for a max or min of
floats the backend reduces, beside the data and in the same NCCL group, one byte per element
that says whether some rank held a NaN there (a MAX over uint8), and writes NaN where one did,
on the communicator's stream after the reduction: every rank then holds NumPy's result.
"""

from __future__ import annotations

from typing import Any

from .._ops import MAX_OR_MIN, ReduceOp

#: the dtypes whose max and min need the NaN bytes
FLOATS = frozenset({"float16", "float32", "float64", "bfloat16"})
#: bfloat16's quiet NaN, as bits (its storage is uint16)
BFLOAT16_NAN = 0x7FC0


def nan_flags(cupy: Any, op: ReduceOp, name: str, x: Any, device: int) -> Any | None:
    """One uint8 per element of ``x``, 1 where it holds a NaN (None where ``op`` on ``name``
    needs none). Computed on the caller's stream, which the NCCL call is ordered after.

    Example:
        >>> flags = nan_flags(cupy, ReduceOp.MAX, "float32", x, comm.device)  # doctest: +SKIP
        >>> nan_flags(None, ReduceOp.SUM, "float32", x, 0) is None   # sum needs none
        True
    """
    if op not in MAX_OR_MIN or name not in FLOATS:
        return None
    with cupy.cuda.Device(device):
        if name == "bfloat16":  # bits: an all-ones exponent and a mantissa that is not 0
            return ((x & 0x7FFF) > 0x7F80).view(cupy.uint8)
        return cupy.isnan(x).view(cupy.uint8)


def put_nan(out: Any, flags: Any, name: str) -> None:
    """NaN in ``out`` wherever the reduced ``flags`` say a rank held one."""
    where = flags.view(bool)
    out[where] = BFLOAT16_NAN if name == "bfloat16" else float("nan")
