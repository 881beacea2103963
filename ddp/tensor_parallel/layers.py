"""Column- and row-parallel linear layers with explicit forward and backward (Megatron style).

Both are built from the full, unsharded weights (the same on every rank, so any run is
reproducible) and keep only their shard. ``weight`` has shape ``(in_features, out_features)``
and ``y = x @ weight + bias``; ``x`` may have any number of leading axes. Sequence
parallelism splits the first axis of the activations outside the pair (``x`` of the column
layer, ``y`` of the row layer) across the group.

Inside a pipeline stage, pass the microbatch: ``forward(x, mb)``, ``backward(dy, mb)``; the
layer keeps each microbatch's input until its backward, and with ``backward(dy, mb,
split=True)`` computes only ``dx`` and leaves the weight gradient to ``backward_weight(mb)``
(a zero-bubble schedule's W action). Gradients of keyed calls add up until ``zero_grad()``;
an unkeyed ``backward(dy)`` sets them (one batch at a time).

Example (the unsharded MLP ``relu(x @ w1 + b1) @ w2 + b2``, on any group size)::

    fc1 = ColumnParallelLinear(w1, b1, tp)
    fc2 = RowParallelLinear(w2, b2, tp)
    h = fc1.forward(x)
    y = fc2.forward(np.maximum(h, 0))
    dh = fc2.backward(dy) * (h > 0)
    dx = fc1.backward(dh)          # fc1.grad_weight: columns [r*k, (r+1)*k) of dL/dw1
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from collectives import CommunicatorLike, InvalidArgumentError, array_module

from ..checkpoint._shard import Shard
from ..sharded import even_shard_size
from ._state import MicrobatchState, add_grad, zero
from .mappings import (
    copy_to_group,
    gather_from_group,
    gather_from_sequence,
    reduce_from_group,
    reduce_scatter_to_sequence,
    scatter_to_group,
)

__all__ = ["ColumnParallelLinear", "RowParallelLinear"]


def _check_weight(call: str, weight: Any, bias: Any) -> tuple[int, int]:
    if weight.ndim != 2:
        raise InvalidArgumentError(
            f"{call}: weight has shape {tuple(weight.shape)}, expected (in_features, out_features)"
        )
    in_features, out_features = weight.shape
    if bias is not None and tuple(bias.shape) != (out_features,):
        raise InvalidArgumentError(
            f"{call}: bias has shape {tuple(bias.shape)}, expected ({out_features},) = (out_features,)"
        )
    return in_features, out_features


def _check_input(call: str, x: Any, features: int) -> None:
    if x.ndim < 1 or x.shape[-1] != features:
        raise InvalidArgumentError(
            f"{call}: x has shape {tuple(x.shape)}, expected (..., {features})"
        )


def _weight_grads(layer: Any, microbatch: Hashable) -> None:
    """Add (or set) ``layer``'s weight and bias gradients of ``y = x @ weight + bias`` from
    the ``(x, dy)`` its backward deferred, for any leading axes."""
    x, dy = layer._state.finish(microbatch)
    x2 = x.reshape(-1, x.shape[-1])
    dy2 = dy.reshape(-1, dy.shape[-1])
    layer.grad_weight = add_grad(layer.grad_weight, x2.T @ dy2, microbatch)
    if layer.bias is not None:
        layer.grad_bias = add_grad(layer.grad_bias, dy2.sum(axis=0), microbatch)


class ColumnParallelLinear:
    """``y = x @ weight + bias`` with the output features split across ``comm``.

    Rank r keeps columns ``[r*k, (r+1)*k)`` of ``weight`` and that block of ``bias``
    (``k = out_features / size``). The input is replicated (or, with ``sequence_parallel``,
    split along its first axis); the output is this rank's block of features, or the full
    output on every rank with ``gather_output=True``.

    Example::

        fc = ColumnParallelLinear(w, b, tp)      # w: (in, out), the same on every rank
        y = fc.forward(x)                        # (..., out / tp.size)
        dx = fc.backward(dy)                     # fc.grad_weight: (in, out / tp.size)
        y = fc.forward(x, 3)                     # in a pipeline stage: microbatch 3
        dx = fc.backward(dy, 3, split=True)      # dx only ...
        fc.backward_weight(3)                    # ... the weight gradient later (added)
    """

    def __init__(
        self,
        weight: Any,
        bias: Any,
        comm: CommunicatorLike,
        *,
        gather_output: bool = False,
        sequence_parallel: bool = False,
    ) -> None:
        call = "ColumnParallelLinear"
        in_features, out_features = _check_weight(call, weight, bias)
        k = even_shard_size(call, "out_features (weight.shape[1])", out_features, comm.size)
        if gather_output and sequence_parallel:
            raise InvalidArgumentError(
                f"{call}: gather_output=True with sequence_parallel=True, expected at most one "
                "(a sequence-parallel column layer feeds a row-parallel layer)"
            )
        xp = array_module(weight)
        lo, hi = comm.rank * k, (comm.rank + 1) * k
        self.comm = comm
        self.in_features, self.out_features = in_features, out_features
        self.gather_output = gather_output
        self.sequence_parallel = sequence_parallel
        self.weight = xp.ascontiguousarray(weight[:, lo:hi]).copy()
        self.bias = None if bias is None else xp.ascontiguousarray(bias[lo:hi]).copy()
        self.grad_weight: Any = None
        self.grad_bias: Any = None
        self._state = MicrobatchState(call)

    def forward(self, x: Any, microbatch: Hashable = None) -> Any:
        """This rank's block of ``x @ weight + bias`` (all of it with ``gather_output``)."""
        _check_input("ColumnParallelLinear.forward", x, self.in_features)
        if self.sequence_parallel:
            x = gather_from_sequence.forward(x, self.comm)
        else:
            x = copy_to_group.forward(x, self.comm)
        self._state.save(microbatch, x)
        y = x @ self.weight
        if self.bias is not None:
            y = y + self.bias
        if self.gather_output:
            y = gather_from_group.forward(y, self.comm)
        return y

    def backward(self, dy: Any, microbatch: Hashable = None, *, split: bool = False) -> Any:
        """``dL/dx``; also this shard's ``grad_weight`` and ``grad_bias`` unless ``split``
        (then :meth:`backward_weight` computes them)."""
        x = self._state.take(microbatch)
        if self.gather_output:
            dy = gather_from_group.backward(dy, self.comm)
        dx = dy @ self.weight.T
        self._state.defer(microbatch, (x, dy))
        if not split:
            self.backward_weight(microbatch)
        if self.sequence_parallel:
            return gather_from_sequence.backward(dx, self.comm)
        return copy_to_group.backward(dx, self.comm)

    def backward_weight(self, microbatch: Hashable = None) -> None:
        """The weight half of ``backward(dy, microbatch, split=True)``: no communication."""
        _weight_grads(self, microbatch)

    def zero_grad(self) -> None:
        """Zero the gradients summed so far, in place (before each step's microbatches)."""
        self.grad_weight, self.grad_bias = zero(self.grad_weight), zero(self.grad_bias)

    # -- checkpoint state (ddp.checkpoint)

    def state_dict(self) -> dict[str, Any]:
        """This rank's column blocks by place in the full layer: ``weight`` ``(in, out)``
        at column ``rank * out / size``, ``bias`` at the same offset.

        Example: ``checkpoint.save("ckpt", {"fc": layer}, comm, step=0)``.
        """
        lo = self.comm.rank * int(self.weight.shape[1])
        state: dict[str, Any] = {
            "weight": Shard(self.weight, (self.in_features, self.out_features), (0, lo))
        }
        if self.bias is not None:
            state["bias"] = Shard(self.bias, (self.out_features,), (lo,))
        return state


class RowParallelLinear:
    """``y = x @ weight + bias`` with the input features split across ``comm``.

    Rank r keeps rows ``[r*k, (r+1)*k)`` of ``weight`` (``k = in_features / size``) and the
    whole ``bias``, added once after the partial products are summed. The input is this rank's
    block of features (or the full input with ``input_is_parallel=False``); the output is
    replicated, or split along its first axis with ``sequence_parallel=True``.

    Example::

        fc = RowParallelLinear(w, b, tp)         # w: (in, out), the same on every rank
        y = fc.forward(h)                        # h: (..., in / tp.size); y: (..., out)
        dh = fc.backward(dy)                     # fc.grad_weight: (in / tp.size, out)
        dh = fc.backward(dy, 3, split=True)      # microbatch 3 of a pipeline: dx only,
        fc.backward_weight(3)                    # the weight gradient later (added)
    """

    def __init__(
        self,
        weight: Any,
        bias: Any,
        comm: CommunicatorLike,
        *,
        input_is_parallel: bool = True,
        sequence_parallel: bool = False,
    ) -> None:
        call = "RowParallelLinear"
        in_features, out_features = _check_weight(call, weight, bias)
        k = even_shard_size(call, "in_features (weight.shape[0])", in_features, comm.size)
        if sequence_parallel and not input_is_parallel:
            raise InvalidArgumentError(
                f"{call}: sequence_parallel=True with input_is_parallel=False, expected "
                "input_is_parallel=True (the input comes from a column-parallel layer)"
            )
        xp = array_module(weight)
        lo, hi = comm.rank * k, (comm.rank + 1) * k
        self.comm = comm
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel = input_is_parallel
        self.sequence_parallel = sequence_parallel
        self.weight = xp.ascontiguousarray(weight[lo:hi]).copy()
        self.bias = None if bias is None else xp.ascontiguousarray(bias).copy()
        self.grad_weight: Any = None
        self.grad_bias: Any = None
        self._state = MicrobatchState(call)

    def forward(self, x: Any, microbatch: Hashable = None) -> Any:
        """``x @ weight + bias``, replicated (or this rank's block of the first axis)."""
        call = "RowParallelLinear.forward"
        if self.input_is_parallel:
            _check_input(call, x, self.weight.shape[0])
        else:
            _check_input(call, x, self.in_features)
            x = scatter_to_group.forward(x, self.comm)
        self._state.save(microbatch, x)
        partial = x @ self.weight
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence.forward(partial, self.comm)
        else:
            y = reduce_from_group.forward(partial, self.comm)
        if self.bias is not None:
            y = y + self.bias
        return y

    def backward(self, dy: Any, microbatch: Hashable = None, *, split: bool = False) -> Any:
        """``dL/dx``; also ``grad_weight`` (this shard's) and ``grad_bias`` (whole) unless
        ``split`` (then :meth:`backward_weight` computes them)."""
        x = self._state.take(microbatch)
        if self.sequence_parallel:
            # The all-gathered dy covers the whole first axis, so its sum is the gradient of
            # the whole bias: no partial bias gradient is left to reduce, unlike Megatron's.
            dy = reduce_scatter_to_sequence.backward(dy, self.comm)
        else:
            dy = reduce_from_group.backward(dy, self.comm)
        dx = dy @ self.weight.T
        self._state.defer(microbatch, (x, dy))
        if not split:
            self.backward_weight(microbatch)
        if not self.input_is_parallel:
            return scatter_to_group.backward(dx, self.comm)
        return dx

    def backward_weight(self, microbatch: Hashable = None) -> None:
        """The weight half of ``backward(dy, microbatch, split=True)``: no communication."""
        _weight_grads(self, microbatch)

    def zero_grad(self) -> None:
        """Zero the gradients summed so far, in place (before each step's microbatches)."""
        self.grad_weight, self.grad_bias = zero(self.grad_weight), zero(self.grad_bias)

    # -- checkpoint state (ddp.checkpoint)

    def state_dict(self) -> dict[str, Any]:
        """This rank's row block of ``weight`` ``(in, out)`` at row ``rank * in / size``, and
        the whole ``bias`` (replicated: written once).

        Example: ``checkpoint.save("ckpt", {"proj": layer}, comm, step=0)``.
        """
        lo = self.comm.rank * int(self.weight.shape[0])
        state: dict[str, Any] = {
            "weight": Shard(self.weight, (self.in_features, self.out_features), (lo, 0))
        }
        if self.bias is not None:
            state["bias"] = self.bias
        return state
