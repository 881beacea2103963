"""Dtype tables: which array dtypes travel, and as what, on each backend.

Every backend looks dtypes up here by name (``"float32"``, ``"bfloat16"``...), so the set of
supported dtypes is the same everywhere. CuPy has no bfloat16 dtype: a uint16 array wrapped
with :func:`collectives.as_bfloat16` is sent as bfloat16 (NCCL reduces it natively; the MPI
backend reduces it in float32 and rounds back).
"""

from __future__ import annotations

import numpy as np

from ._errors import InvalidArgumentError
from ._ops import ReduceOp

#: dtype name -> numpy dtype of the memory that holds it
STORAGE: dict[str, np.dtype] = {
    "int8": np.dtype(np.int8),
    "uint8": np.dtype(np.uint8),
    "int32": np.dtype(np.int32),
    "uint32": np.dtype(np.uint32),
    "int64": np.dtype(np.int64),
    "uint64": np.dtype(np.uint64),
    "float16": np.dtype(np.float16),
    "float32": np.dtype(np.float32),
    "float64": np.dtype(np.float64),
    "bfloat16": np.dtype(np.uint16),
    "complex64": np.dtype(np.complex64),
    "complex128": np.dtype(np.complex128),
}

#: the dtype names every backend carries, in a fixed order (a dtype's index is a stable code)
DTYPES: tuple[str, ...] = tuple(STORAGE)

#: dtype name -> NCCL ncclDataType_t (complex travels as twice as many reals)
NCCL_TYPE = {
    "int8": 0,
    "uint8": 1,
    "int32": 2,
    "uint32": 3,
    "int64": 4,
    "uint64": 5,
    "float16": 6,
    "float32": 7,
    "float64": 8,
    "bfloat16": 9,
    "complex64": 7,
    "complex128": 8,
}

#: ReduceOp -> NCCL ncclRedOp_t (the enum's values are NCCL's codes)
NCCL_OP = {op: int(op) for op in ReduceOp}

COMPLEX = frozenset({"complex64", "complex128"})
FLOATING = frozenset({"float16", "float32", "float64", "bfloat16"}) | COMPLEX

NAME_OF = {dt: name for name, dt in STORAGE.items() if name != "bfloat16"}

#: dtype.char -> name: a str lookup, much cheaper per call than hashing a dtype object
NAME_OF_CHAR = {ch: NAME_OF[np.dtype(ch)] for ch in np.typecodes["All"] if np.dtype(ch) in NAME_OF}


def dtype_name(dtype: np.dtype, call: str, arg: str = "x") -> str:
    """The table name of a NumPy/CuPy dtype, or a clear error for unsupported ones."""
    name = NAME_OF.get(dtype)
    if name is not None:
        return name
    if dtype.name == "bfloat16":  # ml_dtypes' NumPy bfloat16
        return "bfloat16"
    hint = " (wrap uint16 bfloat16 data with collectives.as_bfloat16)" if dtype == np.uint16 else ""
    raise InvalidArgumentError(
        f"{call}: {arg} has dtype {dtype}, expected one of {', '.join(STORAGE)}{hint}"
    )


def check_op_for_dtype(op: ReduceOp, name: str, call: str) -> None:
    """Complex data only supports sum and avg (NCCL reduces it as pairs of reals)."""
    if name in COMPLEX and op not in (ReduceOp.SUM, ReduceOp.AVG):
        raise InvalidArgumentError(
            f"{call}: op {op} is not defined for {name}, expected sum or avg"
        )
