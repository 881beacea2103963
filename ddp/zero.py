"""ZeRO: data-parallel training with the optimizer state split across the ranks.

All parameters live in one flat buffer, padded to a multiple of the group size and seen as
``(size, shard)``: rank r owns shard r. Each step, the flat gradient is reduced so that rank
r holds the mean of its shard (stage 1: an all-reduce, the full mean stays available; stage
2: a reduce-scatter, half the traffic, only the shard's mean is kept); the optimizer updates
shard r with its own state, which is therefore ``1/size`` of the unsharded state; an
all-gather brings every rank the updated parameters. The optimizers are elementwise, so the
trajectory is the one of plain data-parallel training with the same optimizer. Stage 3
also keeps only this rank's shard of the parameters between steps; :meth:`gathered` brings
the full parameters for the forward and backward passes and drops them afterwards.

Example::

    opt = ZeroOptimizer({"w": w, "b": b}, comm, AdamW(lr=1e-3), stage=2)
    for batch in batches:
        opt.zero_grad()
        backward(opt.params, batch, out=opt.grads)   # write local gradients into the views
        opt.step()                                   # opt.params now hold the new values
    opt.state_nbytes                                 # optimizer state held by this rank
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from collectives import BFloat16Array, CommunicatorLike, InvalidArgumentError, array_module

from ._precision import dtype_label, is_half, round_into, storage, to_float32
from .checkpoint._shard import flat_space_shards, placed
from .optim import Optimizer

__all__ = ["ZeroOptimizer", "FlatLayout", "flat_layout"]


@dataclass(frozen=True)
class FlatLayout:
    """Where each parameter sits in the flat space, and how that space splits into shards."""

    offsets: dict[str, tuple[int, int]]
    shapes: dict[str, tuple[int, ...]]
    numel: int
    size: int
    shard: int

    @property
    def padded(self) -> int:
        """Length of the flat space: ``numel`` rounded up to a multiple of ``size``."""
        return self.shard * self.size

    def shard_range(self, rank: int) -> tuple[int, int]:
        """``(start, stop)`` of rank ``rank``'s shard in the flat space."""
        return rank * self.shard, (rank + 1) * self.shard


def flat_layout(shapes: Mapping[str, tuple[int, ...]], size: int) -> FlatLayout:
    """Lay ``shapes`` out back to back, in order, and split the padded space into ``size`` shards.

    Example: ``flat_layout({"w": (2, 3), "b": (3,)}, 4)`` puts ``w`` at ``(0, 6)``, ``b`` at
    ``(6, 9)``, pads 9 to 12 and gives every rank a shard of 3.
    """
    if size < 1:
        raise InvalidArgumentError(f"flat_layout: size must be >= 1, got {size}")
    offsets = {}
    start = 0
    for name, shape in shapes.items():
        n = 1
        for d in shape:
            n *= int(d)
        offsets[name] = (start, start + n)
        start += n
    shard = -(-start // size)
    return FlatLayout(offsets, {k: tuple(v) for k, v in shapes.items()}, start, size, shard)


class ZeroOptimizer:
    """Sharded data-parallel optimizer (ZeRO stage 1 or 2) over the ranks of ``comm``.

    Args:
        params: name -> array, the same names, shapes and dtype on every rank. They are
            copied into one flat buffer; train on :attr:`params` (views into it) from then on.
            Half precision (float16, ``ml_dtypes.bfloat16``, ``as_bfloat16`` bits): each rank
            keeps float32 master weights, master gradients and optimizer state for its shard
            only; the half-precision shard is rounded from the master and all-gathered.
        comm: the data-parallel communicator.
        optimizer: an elementwise optimizer (``ddp.SGD``, ``ddp.AdamW`` or anything with
            ``init_state(param)`` and ``update(param, grad, state)``).
        stage: 1 (gradients all-reduced, the full mean gradient stays in :attr:`grads`),
            2 (gradients reduce-scattered, only this rank's shard of the mean is kept) or
            3 (as 2, and the parameters too are kept as a shard: use :meth:`gathered`).
        broadcast_from: rank whose initial parameters every rank starts from (None: skip).

    Example::

        opt = ZeroOptimizer(params, comm, SGD(lr=0.1, momentum=0.9))
        opt.grads["w"][...] = local_grad_w
        opt.step()
    """

    def __init__(
        self,
        params: Mapping[str, Any],
        comm: CommunicatorLike,
        optimizer: Optimizer,
        *,
        stage: int = 2,
        broadcast_from: int | None = 0,
    ) -> None:
        call = "ZeroOptimizer"
        if stage not in (1, 2, 3):
            raise InvalidArgumentError(f"{call}: stage must be 1, 2 or 3, got {stage!r}")
        if not params:
            raise InvalidArgumentError(f"{call}: params is empty, expected at least one array")
        dtypes = {dtype_label(p) for p in params.values()}
        if len(dtypes) != 1:
            raise InvalidArgumentError(
                f"{call}: params mix dtypes {sorted(dtypes)}, expected one dtype "
                "(make one ZeroOptimizer per dtype)"
            )
        first = next(iter(params.values()))
        half = is_half(first)
        if not half and first.dtype.kind not in "fc":
            raise InvalidArgumentError(
                f"{call}: params have dtype {first.dtype}, expected a floating dtype"
            )
        if broadcast_from is not None and not 0 <= broadcast_from < comm.size:
            raise InvalidArgumentError(
                f"{call}: broadcast_from must be in [0, {comm.size}) or None, got {broadcast_from}"
            )
        xp = array_module(first)
        self.comm, self.optimizer, self.stage = comm, optimizer, stage
        self.layout = flat_layout({k: tuple(v.shape) for k, v in params.items()}, comm.size)
        # bfloat16 bits (uint16) travel and reach the caller declared as bfloat16
        self._bits = isinstance(first, BFloat16Array)
        dtype = storage(first).dtype
        # The padding stays zero in both buffers, so it never moves under an elementwise update.
        self._flat_params = xp.zeros(self.layout.padded, dtype=dtype)
        self._flat_grads = xp.zeros(self.layout.padded, dtype=dtype)
        self.params = self._views(self._flat_params)
        self.grads = self._views(self._flat_grads)
        for name, p in params.items():
            storage(self.params[name])[...] = storage(p)
        if broadcast_from is not None and comm.size > 1:
            comm.broadcast(self._wire(self._flat_params), root=broadcast_from)
        lo, hi = self.layout.shard_range(comm.rank)
        if stage == 1:
            self._grad_shard = self._flat_grads[lo:hi]
        else:
            self._grad_shard = xp.zeros_like(self._flat_grads[lo:hi])
        self._param_shard = self._flat_params[lo:hi].copy()
        # Half-precision parameters: float32 master weights and gradients for this shard only;
        # the optimizer state follows the master's dtype.
        self._master: Any = to_float32(self._wire(self._param_shard)) if half else None
        self._master_grad: Any = xp.zeros(self.layout.shard, xp.float32) if half else None
        if stage == 3:
            self.release_params()
        self.state = optimizer.init_state(
            self._param_shard if self._master is None else self._master
        )

    def _wire(self, array: Any) -> Any:
        """``array`` as the communicator must see it (bfloat16 bits declared)."""
        return BFloat16Array(array) if self._bits else array

    def _views(self, flat: Any) -> dict[str, Any]:
        return {
            name: self._wire(flat[start:stop].reshape(self.layout.shapes[name]))
            for name, (start, stop) in self.layout.offsets.items()
        }

    @property
    def shard_range(self) -> tuple[int, int]:
        """This rank's ``(start, stop)`` in the flat parameter space."""
        return self.layout.shard_range(self.comm.rank)

    @property
    def grad_shard(self) -> Any:
        """The mean gradient of this rank's shard, after :meth:`reduce_grads` (or
        :meth:`step`); float32 for half-precision parameters (what to unscale and clip)."""
        return self._grad_shard if self._master_grad is None else self._master_grad

    @property
    def master_shard(self) -> Any:
        """This rank's float32 master weights (half-precision parameters), else None."""
        return self._master

    @property
    def state_nbytes(self) -> int:
        """Bytes of optimizer state this rank holds, float32 master weights included: for
        AdamW, ``8 * shard`` (``+ 4 * shard`` of master with half-precision parameters)."""
        held = sum(int(v.nbytes) for v in self.state.values() if hasattr(v, "nbytes"))
        return held + (0 if self._master is None else int(self._master.nbytes))

    @property
    def param_nbytes(self) -> int:
        """Bytes of parameters (in their own dtype) this rank holds now: the full flat
        buffer and its shard copy (stage 3, between steps: the shard only)."""
        held = int(self._param_shard.nbytes)
        if self._flat_params is not None:
            held += int(self._flat_params.nbytes)
        return held

    @property
    def grad_nbytes(self) -> int:
        """Bytes of gradients this rank holds: the full flat buffer, the reduced shard
        (stages 2 and 3) and its float32 copy (half-precision parameters)."""
        held = int(self._flat_grads.nbytes)
        if self.stage != 1:
            held += int(self._grad_shard.nbytes)
        return held + (0 if self._master_grad is None else int(self._master_grad.nbytes))

    def gather_params(self) -> dict[str, Any]:
        """Stage 3: all-gather the full parameters into :attr:`params` (collective).

        Other stages always hold them, and this returns :attr:`params` at no cost.
        """
        if self._flat_params is None:
            xp = array_module(self._param_shard)
            self._flat_params = xp.empty(self.layout.padded, dtype=self._param_shard.dtype)
            self._all_gather_params()
            self.params = self._views(self._flat_params)
        return self.params

    def release_params(self) -> None:
        """Stage 3: drop the full parameters; only this rank's shard stays (no-op otherwise)."""
        if self.stage == 3:
            self._flat_params = None
            self.params = {}

    @contextmanager
    def gathered(self) -> Iterator[dict[str, Any]]:
        """``with opt.gathered() as params:`` the full parameters inside, released after.

        Example (stage 3)::

            with opt.gathered() as params:
                loss = forward_backward(params, batch, out=opt.grads)
            opt.step()
        """
        try:
            yield self.gather_params()
        finally:
            self.release_params()

    def zero_grad(self) -> None:
        """Zero every gradient view (and the padding)."""
        self._flat_grads[...] = 0

    def _all_gather_params(self) -> None:
        size, shard = self.comm.size, self.layout.shard
        self.comm.all_gather(
            self._wire(self._param_shard), out=self._wire(self._flat_params.reshape(size, shard))
        )

    def step(self) -> None:
        """Reduce the gradients, update this rank's shard, all-gather the parameters:
        :meth:`reduce_grads` then :meth:`apply_update`.

        Collective: every rank of ``comm`` must call it. In stage 3 the parameters are
        all-gathered only if they are held (inside :meth:`gathered`).
        """
        self.reduce_grads()
        self.apply_update()

    def reduce_grads(self) -> Any:
        """Reduce the gradients to their mean (collective) and return :attr:`grad_shard`.

        Between this and :meth:`apply_update` the shard may be unscaled and clipped; a
        step that a :class:`ddp.LossScaler` skips just never calls :meth:`apply_update`.

        Example::

            if scaler.unscale([opt.reduce_grads()]):
                clip_grad_norm([opt.grad_shard], 1.0, comm=dp)
                opt.apply_update()
            scaler.update()
        """
        size, shard = self.comm.size, self.layout.shard
        if self.stage == 1:
            self.comm.all_reduce(self._wire(self._flat_grads), op="avg")
        else:
            self.comm.reduce_scatter(
                self._wire(self._flat_grads.reshape(size, shard)),
                op="avg",
                out=self._wire(self._grad_shard),
            )
        if self._master_grad is not None:
            self._master_grad[...] = to_float32(self._wire(self._grad_shard))
        return self.grad_shard

    def apply_update(self) -> None:
        """Update this rank's shard from :attr:`grad_shard` and all-gather the parameters
        (collective where they are held)."""
        if self._flat_params is not None and self.stage != 3:
            # Parameters written through the views since the last step are the truth.
            lo, hi = self.shard_range
            self._take_written(self._flat_params[lo:hi])
        if self._master is None:
            self.optimizer.update(self._param_shard, self._grad_shard, self.state)
        else:
            self.optimizer.update(self._master, self._master_grad, self.state)
            round_into(self._wire(self._param_shard), self._master)
        if self._flat_params is not None:
            self._all_gather_params()

    def _take_written(self, view: Any) -> None:
        if self._master is None:
            self._param_shard[...] = view
            return
        # The master keeps what half precision cannot; only elements written since the
        # last step (bit patterns that differ from what was rounded) are taken from the view.
        unsigned = f"u{view.dtype.itemsize}"
        changed = view.view(unsigned) != self._param_shard.view(unsigned)
        if bool(changed.any()):
            xp = array_module(view)
            xp.copyto(self._master, to_float32(self._wire(view)), where=changed)
            self._param_shard[...] = view

    # -- checkpoint state (ddp.checkpoint): parameters and optimizer state by global name

    def state_dict(self, placements: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """``{"params": {name: ...}, "optim": {"step": n, "exp_avg": {name: [Shard, ...]}}}``.

        The optimizer state (and in stage 3 the parameters) come from this rank's flat shard,
        mapped back to blocks of each parameter; ``placements`` (name -> ``(global_shape,
        offsets)``) places parameters that are tensor-parallel blocks. Float32 master
        weights, where the parameters are half precision, are ``optim.master``. The names
        match those of ``DistributedDataParallel`` plus
        :class:`ddp.checkpoint.OptimizerState`, so a checkpoint moves between ZeRO stages,
        plain DDP and any data-parallel size. Example:
        ``checkpoint.save("ckpt", {"model": zero}, comm, step=3)``.
        """
        layout = self.layout
        lo, _ = self.shard_range
        params: dict[str, Any]
        if self.stage == 3:
            params = flat_space_shards(
                self._param_shard, lo, layout.offsets, layout.shapes, placements
            )
        else:  # the flat buffer's own views (no wrapper), replicated over the ranks
            params = {
                name: placed(self._flat_params[a:b].reshape(layout.shapes[name]), name, placements)
                for name, (a, b) in layout.offsets.items()
            }
        optim: dict[str, Any] = {}
        shard = tuple(self._param_shard.shape)
        for key, value in self.state.items():
            if hasattr(value, "shape") and tuple(value.shape) == shard:
                optim[key] = flat_space_shards(value, lo, layout.offsets, layout.shapes, placements)
            else:
                optim[key] = value
        master = getattr(self, "_master", None)  # half-precision parameters only
        if master is not None:
            optim["master"] = flat_space_shards(
                master, lo, layout.offsets, layout.shapes, placements
            )
        return {"params": params, "optim": optim}

    def load_state_dict(self, loaded: Mapping[str, Any]) -> None:
        """After :func:`ddp.checkpoint.load` filled the arrays: take the step, refresh the shard."""
        for key, value in loaded["optim"].items():
            if not isinstance(value, Mapping):
                self.state[key] = value
        if self.stage != 3:
            lo, hi = self.shard_range
            self._param_shard[...] = self._flat_params[lo:hi]
