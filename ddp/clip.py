"""Gradient clipping by the global norm, for replicated and sharded gradients alike."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from collectives import CommunicatorLike, InvalidArgumentError, array_module

from ._scalars import reduce_scalars


def _arrays(grads: Any, call: str, arg: str) -> list[Any]:
    if grads is None:
        return []
    if isinstance(grads, Mapping):
        return list(grads.values())
    if hasattr(grads, "shape") and hasattr(grads, "dtype"):
        raise InvalidArgumentError(
            f"{call}: {arg} must be a mapping or a sequence of arrays, got one array"
        )
    if not isinstance(grads, Iterable):
        raise InvalidArgumentError(
            f"{call}: {arg} must be a mapping or a sequence of arrays, got {type(grads).__name__}"
        )
    return list(grads)


def _local_sum_squares(arrays: list[Any]) -> float:
    """Sum of squares in float64 (one host sync per array module, not one per array)."""
    total = 0.0
    partial: dict[Any, Any] = {}
    for g in arrays:
        xp = array_module(g)
        g64 = g.astype(np.complex128 if g.dtype.kind == "c" else np.float64, copy=False)
        value = xp.vdot(g64.ravel(), g64.ravel()).real
        partial[xp] = partial[xp] + value if xp in partial else value
    for value in partial.values():
        total += float(value)
    return total


def _nan_max(values: list[float]) -> float:
    """The largest of ``values`` (0.0 if none), NaN if any is: Python's ``max`` keeps its
    first operand against a NaN, so a NaN after a number was lost."""
    return float(np.max(values)) if values else 0.0


def _local_max_abs(arrays: list[Any]) -> float:
    return _nan_max([float(array_module(g).abs(g).max()) for g in arrays if g.size])


def clip_grad_norm(
    grads: Any,
    max_norm: float,
    comm: CommunicatorLike | None = None,
    *,
    replicated: Any = None,
    norm_type: float = 2.0,
) -> float:
    """Scale gradients in place so that their global norm is at most ``max_norm``.

    ``grads`` (a mapping or a sequence of arrays) are the gradients this rank holds. With
    ``comm=None`` they are the whole model (plain data parallel: every rank holds the same
    reduced gradients and computes the same norm). With a ``comm``, they are this rank's
    *shard* (tensor parallel, ZeRO): the squares are summed over ``comm``, so every rank gets
    the norm of the whole model. Gradients that every rank of ``comm`` holds in full (the
    bias of a row-parallel layer, layer norms) go in ``replicated``: they count once.

    Returns the norm before clipping (a float, the same on every rank). A non-finite norm is
    returned without scaling anything.

    Example:
        >>> grads = {"w": np.full(4, 3.0, np.float32), "b": np.full(4, 4.0, np.float32)}
        >>> clip_grad_norm(grads, 1.0)              # replicated (ddp.grads): sqrt(4*9 + 4*16)
        10.0
        >>> grads["w"].round(6)                     # scaled by 1/10
        array([0.3, 0.3, 0.3, 0.3], dtype=float32)
        >>> tp = comm                               # the tensor-parallel communicator
        >>> shard_grads = [np.full(4, 0.5, np.float32)]
        >>> clip_grad_norm(shard_grads, 10.0, comm=tp)   # sharded over tp: the whole norm
        1.0
    """
    call = "clip_grad_norm"
    if not (max_norm > 0):
        raise InvalidArgumentError(f"{call}: max_norm must be > 0, got {max_norm}")
    if norm_type not in (2.0, math.inf):
        raise InvalidArgumentError(f"{call}: norm_type must be 2 or inf, got {norm_type}")
    sharded = _arrays(grads, call, "grads")
    shared = _arrays(replicated, call, "replicated")
    if norm_type == 2.0:
        local = _local_sum_squares(sharded)
        if comm is not None:
            local = reduce_scalars(comm, [local], "sum")[0]
        norm = math.sqrt(local + _local_sum_squares(shared))
    else:
        local = _local_max_abs(sharded)
        if comm is not None:
            local = reduce_scalars(comm, [local], "max")[0]
        norm = _nan_max([local, _local_max_abs(shared)])
    if math.isfinite(norm) and norm > max_norm:
        # the epsilon keeps the clipped norm just under max_norm, as torch does
        scale = max_norm / (norm + 1e-6)
        for g in sharded + shared:
            g *= scale
    return norm
