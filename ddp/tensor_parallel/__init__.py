"""Tensor parallelism on plain arrays: region mappings, parallel layers, vocab-parallel loss.

Every layer and mapping has an explicit ``forward`` and ``backward`` (no autograd), and each
computes exactly what the unsharded computation does. See ``docs/tensor_parallel.md``.

Example::

    from ddp.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    fc1, fc2 = ColumnParallelLinear(w1, b1, tp), RowParallelLinear(w2, b2, tp)
    y = fc2.forward(fc1.forward(x))
"""

from __future__ import annotations

from .layers import ColumnParallelLinear, RowParallelLinear
from .mappings import (
    MAPPINGS,
    copy_to_group,
    gather_from_group,
    gather_from_sequence,
    reduce_from_group,
    reduce_scatter_to_sequence,
    scatter_to_group,
    scatter_to_sequence,
)
from .sequence import allreduce_sequence_parallel_grads
from .vocab import VocabParallelCrossEntropy, VocabParallelEmbedding, vocab_parallel_cross_entropy

__all__ = [
    "ColumnParallelLinear",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "VocabParallelCrossEntropy",
    "vocab_parallel_cross_entropy",
    "copy_to_group",
    "reduce_from_group",
    "scatter_to_group",
    "gather_from_group",
    "scatter_to_sequence",
    "gather_from_sequence",
    "reduce_scatter_to_sequence",
    "MAPPINGS",
    "allreduce_sequence_parallel_grads",
]
