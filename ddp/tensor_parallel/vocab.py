"""Vocabulary-parallel embedding and softmax cross-entropy: the vocabulary split across ranks.

Rank r owns the token ids ``[r*k, (r+1)*k)`` (``k = vocab / size``): rows of the embedding
table, columns of the output logits. Neither the table nor the logits are ever gathered:
the embedding sums one-hot partial lookups over the group, and the cross-entropy reduces
only a max and two per-position sums.

Example (a language-model head tied to nothing, on any group size)::

    emb = VocabParallelEmbedding(table, tp)             # table: (vocab, dim)
    h = emb.forward(ids)                                # (..., dim), replicated
    logits = ColumnParallelLinear(w_out, None, tp).forward(h)   # (..., vocab / size)
    loss, dlogits = vocab_parallel_cross_entropy(logits, ids_next, tp)
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from collectives import CommunicatorLike, InvalidArgumentError, array_module

from ..checkpoint._shard import Shard
from ..sharded import even_shard_size
from ._state import MicrobatchState, add_grad, zero
from .mappings import reduce_from_group, reduce_scatter_to_sequence

__all__ = ["VocabParallelEmbedding", "VocabParallelCrossEntropy", "vocab_parallel_cross_entropy"]


def _local_ids(ids: Any, lo: int, hi: int) -> tuple[Any, Any]:
    """``(index, owned)``: ids shifted into this rank's block (0 where not owned), and the mask."""
    xp = array_module(ids)
    owned = (ids >= lo) & (ids < hi)
    return xp.where(owned, ids - lo, 0), owned


def _check_ids(call: str, ids: Any, vocab: int) -> None:
    if ids.dtype.kind not in "iu":
        raise InvalidArgumentError(f"{call}: ids have dtype {ids.dtype}, expected an integer dtype")
    # One host sync, worth it: an id outside the vocabulary would be silently dropped.
    if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise InvalidArgumentError(
            f"{call}: ids must be in [0, {vocab}), got values in "
            f"[{int(ids.min())}, {int(ids.max())}]"
        )


def _scatter_add(target: Any, index: Any, values: Any) -> None:
    """``target[index[i]] += values[i]`` with repeated indices summed (NumPy and CuPy)."""
    xp = array_module(target)
    if hasattr(xp, "add") and hasattr(xp.add, "at"):
        xp.add.at(target, index, values)
    else:  # older CuPy
        import cupyx

        cupyx.scatter_add(target, index, values)


class VocabParallelEmbedding:
    """``weight[ids]`` with the rows of ``weight`` (the vocabulary) split across ``comm``.

    Built from the full table ``(vocab, dim)``; rank r keeps rows ``[r*k, (r+1)*k)``. The
    output is replicated, or split along its first axis with ``sequence_parallel=True``.
    After ``backward``, ``grad_weight`` holds this rank's rows of the gradient.

    Example::

        emb = VocabParallelEmbedding(table, tp)
        h = emb.forward(np.array([[3, 1, 4]]))   # (1, 3, dim)
        emb.backward(dh)                          # emb.grad_weight: (vocab / size, dim)
        h = emb.forward(ids, 3)                   # microbatch 3 of a pipeline stage
        emb.backward(dh, 3, split=True)           # the communication only ...
        emb.backward_weight(3)                    # ... the rows' gradient later (added)

    Keyed calls keep each microbatch's ids until its backward, and add their gradients up
    until ``zero_grad()``; an unkeyed ``backward(dy)`` sets ``grad_weight``.
    """

    def __init__(
        self, weight: Any, comm: CommunicatorLike, *, sequence_parallel: bool = False
    ) -> None:
        call = "VocabParallelEmbedding"
        if weight.ndim != 2:
            raise InvalidArgumentError(
                f"{call}: weight has shape {tuple(weight.shape)}, expected (vocab, dim)"
            )
        k = even_shard_size(call, "vocab (weight.shape[0])", weight.shape[0], comm.size)
        xp = array_module(weight)
        self.comm = comm
        self.vocab, self.dim = weight.shape
        self.sequence_parallel = sequence_parallel
        self.range = (comm.rank * k, (comm.rank + 1) * k)
        self.weight = xp.ascontiguousarray(weight[self.range[0] : self.range[1]]).copy()
        self.grad_weight: Any = None
        self._state = MicrobatchState(call)

    def forward(self, ids: Any, microbatch: Hashable = None) -> Any:
        """The embeddings of ``ids`` (any integer array), shape ``(*ids.shape, dim)``."""
        _check_ids("VocabParallelEmbedding.forward", ids, self.vocab)
        index, owned = _local_ids(ids, *self.range)
        partial = self.weight[index] * owned[..., None].astype(self.weight.dtype)
        self._state.save(microbatch, ids)
        if self.sequence_parallel:
            return reduce_scatter_to_sequence.forward(partial, self.comm)
        return reduce_from_group.forward(partial, self.comm)

    def backward(self, dy: Any, microbatch: Hashable = None, *, split: bool = False) -> None:
        """``grad_weight`` (this rank's rows) unless ``split`` (then :meth:`backward_weight`
        computes it); ids have no gradient, so returns None."""
        ids = self._state.take(microbatch)
        if self.sequence_parallel:
            dy = reduce_scatter_to_sequence.backward(dy, self.comm)
        else:
            dy = reduce_from_group.backward(dy, self.comm)
        self._state.defer(microbatch, (ids, dy))
        if not split:
            self.backward_weight(microbatch)
        return None

    def backward_weight(self, microbatch: Hashable = None) -> None:
        """The weight half of ``backward(dy, microbatch, split=True)``: no communication."""
        ids, dy = self._state.finish(microbatch)
        xp = array_module(dy)
        index, owned = _local_ids(ids, *self.range)
        grad = xp.zeros_like(self.weight)
        rows = dy.reshape(-1, self.dim) * owned.reshape(-1, 1).astype(dy.dtype)
        _scatter_add(grad, index.reshape(-1), rows)
        self.grad_weight = add_grad(self.grad_weight, grad, microbatch)

    def zero_grad(self) -> None:
        """Zero the gradient summed so far, in place (before each step's microbatches)."""
        self.grad_weight = zero(self.grad_weight)

    # -- checkpoint state (ddp.checkpoint)

    def state_dict(self) -> dict[str, Any]:
        """This rank's rows of the ``(vocab, dim)`` embedding, placed at ``range[0]``.

        Example: ``checkpoint.save("ckpt", {"wte": embedding}, comm, step=0)``.
        """
        return {"weight": Shard(self.weight, (self.vocab, self.dim), (self.range[0], 0))}


class VocabParallelCrossEntropy:
    """Softmax cross-entropy per position, over logits whose last axis is split across ``comm``.

    ``forward(logits, target)`` takes this rank's block of the vocabulary ``(..., vocab /
    size)`` and the full targets ``(...)`` (the same on every rank) and returns the loss at
    every position ``(...)``, replicated. ``backward(dloss)`` returns this rank's block of
    ``dL/dlogits``. Communication: one all-reduce (max) and one all-reduce (sum) of two
    numbers per position; the logits never leave their rank.

    Example::

        ce = VocabParallelCrossEntropy(tp)
        loss = ce.forward(logits, target)           # (batch, seq)
        dlogits = ce.backward(np.full(loss.shape, 1.0 / loss.size))   # gradient of the mean
        loss = ce.forward(logits, target, 3)        # microbatch 3, with others in flight
        dlogits = ce.backward(dloss, 3)
    """

    def __init__(self, comm: CommunicatorLike) -> None:
        self.comm = comm
        self._state = MicrobatchState("VocabParallelCrossEntropy")

    def forward(self, logits: Any, target: Any, microbatch: Hashable = None) -> Any:
        """The loss ``logsumexp(logits) - logits[target]`` at every position."""
        call = "VocabParallelCrossEntropy.forward"
        if tuple(target.shape) != tuple(logits.shape[:-1]):
            raise InvalidArgumentError(
                f"{call}: target has shape {tuple(target.shape)}, expected "
                f"{tuple(logits.shape[:-1])} = logits.shape[:-1]"
            )
        xp = array_module(logits)
        k = logits.shape[-1]
        _check_ids(call, target, k * self.comm.size)
        # Shift by the global max so exp never overflows; every rank shifts by the same value.
        shift = xp.ascontiguousarray(logits.max(axis=-1))
        self.comm.all_reduce(shift, op="max")
        shifted = logits - shift[..., None]
        exp = xp.exp(shifted)
        index, owned = _local_ids(target, self.comm.rank * k, (self.comm.rank + 1) * k)
        picked = xp.take_along_axis(shifted, index[..., None], axis=-1)[..., 0]
        # One all-reduce for both per-position sums: the softmax denominator and the target logit.
        sums = xp.stack([exp.sum(axis=-1), picked * owned.astype(logits.dtype)])
        sums = reduce_from_group.forward(sums, self.comm)
        sum_exp, target_logit = sums[0], sums[1]
        self._state.save(microbatch, (exp / sum_exp[..., None], index, owned))
        return xp.log(sum_exp) - target_logit

    def backward(self, dloss: Any, microbatch: Hashable = None) -> Any:
        """This rank's block of ``dL/dlogits`` given ``dL/dloss`` at every position."""
        xp = array_module(dloss)
        softmax, index, owned = self._state.peek(microbatch)
        if tuple(dloss.shape) != tuple(softmax.shape[:-1]):  # refused: the state stays
            raise InvalidArgumentError(
                f"VocabParallelCrossEntropy.backward: dloss has shape {tuple(dloss.shape)}, "
                f"expected {tuple(softmax.shape[:-1])}"
            )
        self._state.take(microbatch)
        columns = xp.arange(softmax.shape[-1])
        onehot = (columns == index[..., None]) & owned[..., None]
        grad = softmax - onehot.astype(softmax.dtype)
        return grad * dloss[..., None]


def vocab_parallel_cross_entropy(
    logits: Any, target: Any, comm: CommunicatorLike
) -> tuple[Any, Any]:
    """``(mean loss, dL/dlogits)`` over every position, for this rank's block of the vocabulary.

    The shape of a pipeline ``loss_fn``. Example::

        loss, dlogits = vocab_parallel_cross_entropy(logits, target, tp)   # loss: a 0-d array
    """
    ce = VocabParallelCrossEntropy(comm)
    losses = ce.forward(logits, target)
    xp = array_module(losses)
    dloss = xp.full(losses.shape, 1.0 / max(losses.size, 1), dtype=losses.dtype)
    return losses.mean(), ce.backward(dloss)
