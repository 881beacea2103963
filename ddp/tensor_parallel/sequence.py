"""Gradients of replicated parameters under sequence parallelism.

With ``sequence_parallel``, a parameter that every tensor-parallel rank holds whole (a layer
norm's gain and bias, a row-parallel layer's bias added after the reduce-scatter, a position
table) sees only this rank's block of the sequence: its gradient on each rank is one term
of a sum over the group. :func:`allreduce_sequence_parallel_grads` adds the terms up (one
all-reduce for all of them), after which every rank holds the whole gradient and takes the
same step.

Example::

    for block in blocks:
        block.backward(dy)                     # layer-norm grads: this rank's sequence block
    allreduce_sequence_parallel_grads([g_ln, b_ln, g_bias], tp)   # now whole, on every rank
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from collectives import CommunicatorLike, InvalidArgumentError, array_module

__all__ = ["allreduce_sequence_parallel_grads"]


def allreduce_sequence_parallel_grads(grads: Sequence[Any], comm: CommunicatorLike) -> None:
    """Sum ``grads`` in place over ``comm`` with one all-reduce of their concatenation.

    ``grads`` must share one dtype and array module; a group of one does nothing.
    """
    grads = list(grads)
    if comm.size == 1 or not grads:
        return
    dtypes = {str(g.dtype) for g in grads}
    if len(dtypes) != 1:
        raise InvalidArgumentError(
            f"allreduce_sequence_parallel_grads: grads mix dtypes {sorted(dtypes)}, "
            "expected one dtype"
        )
    xp = array_module(grads[0])
    flat = xp.concatenate([g.reshape(-1) for g in grads])
    comm.all_reduce(flat, op="sum")
    start = 0
    for g in grads:
        g[...] = flat[start : start + g.size].reshape(g.shape)
        start += g.size
