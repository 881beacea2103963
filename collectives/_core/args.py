"""The argument checks the verbs make before any communication: pure functions of the
arguments and of the communicator's rank and size, shared by :class:`~collectives.Communicator`
and the hierarchical view (:mod:`collectives._topology.hierarchical`).

Each raises ``InvalidArgumentError`` naming the call, or returns what the call goes on with.

Example:
    >>> checked_op("all_reduce", "avg", "float32")
    <ReduceOp.AVG: 4>
    >>> check_root("reduce", 4, size=4)
    Traceback (most recent call last):
    collectives._errors.InvalidArgumentError: reduce: root must be an int in [0, 4), got 4
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

from .._arrays import (
    array_module,
    is_slot,
    may_share_memory,
    overlap_check,
    same_kind,
    separate_owners,
    unwrap,
)
from .._dtypes import COMPLEX, check_op_for_dtype
from .._errors import InvalidArgumentError
from .._ops import BY_NAME, ReduceOp, parse_op


def checked_op(call: str, op: Any, name: str) -> ReduceOp:
    """``op`` as a :class:`ReduceOp`, one that reduces dtype ``name``."""
    if (type(op) is str or type(op) is ReduceOp) and name not in COMPLEX:
        known = BY_NAME.get(op)  # "sum" or ReduceOp.SUM: every real dtype takes every op
        if known is not None:
            return known
    op = parse_op(op, call)
    check_op_for_dtype(op, name, call)
    return op


def integer(value: Any) -> int | None:
    """``value`` as an int where it is an integer (a NumPy one too; not a bool), else None."""
    if type(value) is int:
        return value
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return None


def check_root(call: str, root: Any, size: int) -> int:
    """``root`` as an int in ``[0, size)``."""
    r = integer(root)
    if r is None or not 0 <= r < size:
        raise InvalidArgumentError(f"{call}: root must be an int in [0, {size}), got {root!r}")
    return r


def check_peer(call: str, peer: Any, rank: int, size: int, grouped: bool) -> int:
    """A peer of point-to-point calls, as an int; this rank only inside ``comm.group()``
    (``grouped``)."""
    given, peer = peer, integer(peer)
    if peer is None or not 0 <= peer < size:
        raise InvalidArgumentError(f"{call}: peer must be an int in [0, {size}), got {given!r}")
    if peer == rank and not grouped:
        raise InvalidArgumentError(
            f"{call}: peer {peer} is this rank: a {call} to itself outside "
            "comm.group() can never complete"
        )
    return peer


def check_sendrecv_peers(
    peer: Any, source: Any, rank: int, size: int, grouped: bool
) -> tuple[int, int]:
    """A sendrecv's destination and source, as ints: to this rank only from it, or inside a
    group."""
    ranks = []
    for what, value in (("peer", peer), ("source", source)):
        r = integer(value)
        if r is None or not 0 <= r < size:
            raise InvalidArgumentError(
                f"sendrecv: {what} must be an int in [0, {size}), got {value!r}"
            )
        ranks.append(r)
    peer, source = ranks
    if (peer == rank) != (source == rank) and not grouped:
        raise InvalidArgumentError(
            f"sendrecv: peer {peer} and source {source}, one of them this rank: outside "
            "comm.group() a rank's message to itself is only received by its sendrecv from "
            "itself (peer and source both this rank)"
        )
    return peer, source


def check_leading(call: str, x: Any, size: int) -> None:
    """``x``'s first axis is of the communicator's size."""
    if x.ndim == 0 or x.shape[0] != size:
        raise InvalidArgumentError(
            f"{call}: x has shape {x.shape}, expected a first axis of size {size}"
        )


def new_like(x: Any, shape: tuple) -> Any:
    """A new array of ``x``'s module and dtype (on ``x``'s GPU for a device array)."""
    xp = array_module(x)
    if xp is np:
        return np.empty(shape, x.dtype)
    with x.device:  # on x's GPU, whichever is current
        return xp.empty(shape, x.dtype)


def plain_like(out: Any, x: Any, shape: tuple) -> bool:
    """Whether ``out`` passes the checks of its kind without them: a C-contiguous NumPy
    array of ``x``'s dtype (``x`` a NumPy array) and of ``shape``. Where they meet is left to
    check.

    Example:
        >>> x = np.zeros((2, 3))
        >>> plain_like(np.zeros(3), x, (3,)), plain_like(np.zeros(3, np.float32), x, (3,))
        (True, False)
    """
    return (
        type(out) is np.ndarray
        and type(x) is np.ndarray
        and out.dtype is x.dtype
        and out.shape == shape
        and out.flags.c_contiguous
    )


def checked_out(call: str, out: Any, x: Any, name: str, shape: tuple) -> Any:
    """``out`` (unwrapped) where it is of ``x``'s kind and of ``shape``; ``x`` when it is
    ``x`` itself."""
    if plain_like(out, x, shape) and (separate_owners(x, out) or not may_share_memory(x, out)):
        return out  # the common case: apart from x
    out, out_name = unwrap(out, call, "out")
    same_kind(call, x, name, out, out_name, shape)
    return x if overlap_check(call, x, out) else out


def checked_slot_out(
    call: str, out: Any, x: Any, name: str, shape: tuple, rank: int, out_is_part: bool = False
) -> Any:
    """``out`` for calls whose in-place form has one array be the rank's slot of the other."""
    if not plain_like(out, x, shape):
        out, out_name = unwrap(out, call, "out")
        same_kind(call, x, name, out, out_name, shape)
    elif separate_owners(x, out):
        return out  # the common out-of-place call
    part, whole = (out, x) if out_is_part else (x, out)
    if not is_slot(part, whole, rank):
        overlap_check(call, x, out)
    return out


def check_writeable(call: str, x: Any, out: Any) -> None:
    """A NumPy ``out`` that the call writes is writeable."""
    if type(out) is np.ndarray and not out.flags.writeable:
        what = "x" if out is x else "out"
        raise InvalidArgumentError(
            f"{call}: {what} is read-only, and {call} writes its result there"
        )


def check_split(color: Any, key: Any) -> tuple[int | None, int | None]:
    """``split``'s color (a non-negative integer below 2**31, or None) and key (a C int, or
    None), as ints."""
    c, k = integer(color), integer(key)
    if color is not None and (c is None or c < 0):
        raise InvalidArgumentError(
            f"split: color must be a non-negative int or None, got {color!r}"
        )
    if key is not None and (k is None or not -(2**31) <= k < 2**31):
        raise InvalidArgumentError(
            f"split: key must be an int in [-2**31, 2**31) or None, got {key!r}"
        )
    if c is not None and c >= 2**31:
        raise InvalidArgumentError(f"split: color must be below 2**31, got {color!r}")
    return c, k
