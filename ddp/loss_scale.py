"""Dynamic loss scaling for half-precision training, agreed by every rank of the mesh.

float16 holds nothing below 6e-8 and nothing above 65504. Multiplying the loss gradient by a
large scale lifts small gradients out of the underflow; dividing the (float32) gradients by
the same scale before the update gives the true step. When the scale is too large some
gradient overflows: the step is skipped and the scale halved. After ``growth_interval``
good steps in a row the scale doubles again, so it settles just below overflow.

A rank that skips a step alone is a silent divergence (its parameters, or its shard of
them, no longer match the others'), so the found-infinity flag is reduced with MAX over
every rank of the mesh before anyone decides: data, tensor and pipeline parallel ranks all
skip together and all change their scale together.

Example::

    scaler = LossScaler(world)                      # the communicator of the whole mesh
    for batch in batches:
        ddp.zero_grad()
        backward(params, batch, dloss=scaler.scale, out=ddp.grads)  # scaled gradients
        ddp.finish()                                 # float32 buckets: reduce_dtype="float32"
        if scaler.unscale(ddp.grads):                # True: finite on every rank
            clip_grad_norm(ddp.grads, 1.0)
            opt.step(params, ddp.grads, states)
        scaler.update()                              # back off or grow, the same everywhere
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from collectives import BFloat16Array, CommunicatorLike, InvalidArgumentError, array_module

from ._scalars import reduce_scalars

__all__ = ["LossScaler"]

_STATE_KEYS = (
    "scale",
    "growth_factor",
    "backoff_factor",
    "growth_interval",
    "good_steps",
    "skipped_steps",
)


def _named(grads: Any, call: str) -> list[tuple[str, Any]]:
    if isinstance(grads, Mapping):
        return [(f"grads[{k!r}]", v) for k, v in grads.items()]
    if hasattr(grads, "shape") or isinstance(grads, BFloat16Array):
        raise InvalidArgumentError(
            f"{call}: grads must be a mapping or a sequence of arrays, got one array"
        )
    if not isinstance(grads, Iterable):
        raise InvalidArgumentError(
            f"{call}: grads must be a mapping or a sequence of arrays, got {type(grads).__name__}"
        )
    return [(f"grads[{i}]", v) for i, v in enumerate(grads)]


class LossScaler:
    """Dynamic loss scale, in the manner of ``torch.amp.GradScaler``.

    Args:
        comm: the communicator spanning every rank of the mesh (the world of a
            ``DeviceMesh``), or a sequence of communicators whose product is the mesh (its
            ``dp``, ``tp`` and ``pp`` axes: MAX over each in turn is MAX over all). None:
            this process trains alone.
        init_scale: the first scale (a power of two keeps scaling exact).
        growth_factor: multiplies the scale after ``growth_interval`` good steps in a row.
        backoff_factor: multiplies the scale after a step with an infinity or a NaN.
        growth_interval: good steps in a row before the scale grows.
        enabled: False gives a scale of 1 and never skips, with no communication, so that a
            float32 run keeps the same loop.

    Example::

        scaler = LossScaler(mesh.comm, init_scale=2.0**16, growth_interval=2000)
        dlogits *= scaler.scale
    """

    def __init__(
        self,
        comm: CommunicatorLike | None = None,
        *,
        init_scale: float = 2.0**16,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
        growth_interval: int = 2000,
        enabled: bool = True,
    ) -> None:
        call = "LossScaler"
        self._check_config(call, init_scale, growth_factor, backoff_factor, growth_interval)
        if comm is None:
            self.comms: list[CommunicatorLike] = []
        elif isinstance(comm, Sequence):
            self.comms = list(comm)
        else:
            self.comms = [comm]
        for c in self.comms:
            if not hasattr(c, "all_reduce"):
                raise InvalidArgumentError(
                    f"{call}: comm must be a communicator, a sequence of them or None, "
                    f"got {type(c).__name__}"
                )
        self.enabled = bool(enabled)
        self._scale = float(init_scale)
        self.growth_factor, self.backoff_factor = float(growth_factor), float(backoff_factor)
        self.growth_interval = int(growth_interval)
        #: good steps in a row since the scale last changed
        self.good_steps = 0
        #: steps skipped because some rank found an infinity or a NaN
        self.skipped_steps = 0
        self._found_inf: bool | None = None  # None: not unscaled in this step yet

    @staticmethod
    def _check_config(
        call: str, init_scale: Any, growth_factor: Any, backoff_factor: Any, interval: Any
    ) -> None:
        if not (isinstance(init_scale, numbers.Real) and 0 < float(init_scale) < math.inf):
            raise InvalidArgumentError(
                f"{call}: init_scale must be > 0 and finite, got {init_scale}"
            )
        if not (isinstance(growth_factor, numbers.Real) and 1 < float(growth_factor) < math.inf):
            raise InvalidArgumentError(f"{call}: growth_factor must be > 1, got {growth_factor}")
        if not (isinstance(backoff_factor, numbers.Real) and 0 < float(backoff_factor) < 1):
            raise InvalidArgumentError(
                f"{call}: backoff_factor must be in (0, 1), got {backoff_factor}"
            )
        if not (
            isinstance(interval, numbers.Integral)
            and not isinstance(interval, bool)
            and int(interval) >= 1
        ):
            raise InvalidArgumentError(
                f"{call}: growth_interval must be an int >= 1, got {interval!r}"
            )

    @property
    def scale(self) -> float:
        """What to multiply the loss (or its gradient) by this step; 1.0 when disabled."""
        return self._scale if self.enabled else 1.0

    @property
    def found_inf(self) -> bool | None:
        """Whether some rank found an infinity or a NaN this step (None before ``unscale``)."""
        return self._found_inf

    def unscale(self, grads: Any) -> bool:
        """Divide ``grads`` by the scale in place and agree on whether every rank's are finite.

        ``grads`` (a mapping or a sequence of float32 or float64 arrays) are the gradients
        this rank holds: replicated, or its shard. Half-precision gradients are refused:
        dividing them in their own precision would underflow what the scale saved; unscale
        the float32 ones (``DistributedDataParallel(..., reduce_dtype="float32")``,
        ``ZeroOptimizer.grad_shard``). Collective over ``comm``: every rank calls it once
        per step, before clipping and the update.

        Returns True when every gradient of every rank is finite (take the step), False
        when some rank found an infinity or a NaN (skip it, on every rank).
        """
        call = "LossScaler.unscale"
        if self._found_inf is not None:
            raise InvalidArgumentError(
                f"{call}: already called in this step (gradients would be divided twice); "
                "call update() first"
            )
        arrays = []
        for label, g in _named(grads, call):
            kind = getattr(getattr(g, "dtype", None), "kind", None)
            if isinstance(g, BFloat16Array) or kind != "f" or g.dtype.itemsize < 4:
                dtype = "bfloat16" if isinstance(g, BFloat16Array) else getattr(g, "dtype", None)
                raise InvalidArgumentError(
                    f"{call}: {label} has dtype {dtype}, expected float32 or float64 "
                    "(unscale the float32 gradients: reduce_dtype='float32' in DDP, or "
                    "ZeroOptimizer.grad_shard)"
                )
            arrays.append(g)
        if not self.enabled:
            self._found_inf = False
            return True
        inverse = 1.0 / self._scale
        bad: dict[Any, Any] = {}
        for g in arrays:
            xp = array_module(g)
            g *= g.dtype.type(inverse)
            flag = ~xp.isfinite(g).all() if g.size else False
            bad[xp] = (bad[xp] | flag) if xp in bad else flag
        local = float(any(bool(v) for v in bad.values()))
        for c in self.comms:
            local = reduce_scalars(c, [local], "max")[0]
        self._found_inf = local > 0
        return not self._found_inf

    def update(self) -> None:
        """End the step: halve the scale if some rank overflowed, grow it after
        ``growth_interval`` good steps in a row (the same decision on every rank)."""
        if self._found_inf is None:
            raise InvalidArgumentError("LossScaler.update: unscale() was not called in this step")
        if self.enabled:
            if self._found_inf:
                self._scale *= self.backoff_factor
                self.good_steps = 0
                self.skipped_steps += 1
            else:
                self.good_steps += 1
                if self.good_steps >= self.growth_interval:
                    self._scale *= self.growth_factor
                    self.good_steps = 0
        self._found_inf = None

    def state_dict(self) -> dict[str, float | int]:
        """The scaler's state as plain numbers, for a checkpoint.

        Example:
            >>> LossScaler(init_scale=1024.0).state_dict()["scale"]
            1024.0
        """
        return {
            "scale": self._scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "good_steps": self.good_steps,
            "skipped_steps": self.skipped_steps,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back what :meth:`state_dict` gave (checked before anything changes)."""
        call = "LossScaler.load_state_dict"
        if not isinstance(state, Mapping):
            raise InvalidArgumentError(
                f"{call}: state must be a mapping, got {type(state).__name__}"
            )
        missing = [k for k in _STATE_KEYS if k not in state]
        extra = [k for k in state if k not in _STATE_KEYS]
        if missing or extra:
            raise InvalidArgumentError(f"{call}: missing keys {missing}, unknown keys {extra}")
        self._check_config(
            call,
            state["scale"],
            state["growth_factor"],
            state["backoff_factor"],
            state["growth_interval"],
        )
        for key in ("good_steps", "skipped_steps"):
            value = state[key]
            if not (
                isinstance(value, numbers.Integral)
                and not isinstance(value, bool)
                and int(value) >= 0
            ):
                raise InvalidArgumentError(f"{call}: {key} must be an int >= 0, got {value!r}")
        self._scale = float(state["scale"])
        self.growth_factor = float(state["growth_factor"])
        self.backoff_factor = float(state["backoff_factor"])
        self.growth_interval = int(state["growth_interval"])
        self.good_steps = int(state["good_steps"])
        self.skipped_steps = int(state["skipped_steps"])
        self._found_inf = None

    def __repr__(self) -> str:
        return (
            f"LossScaler(scale={self._scale}, good_steps={self.good_steps}, "
            f"skipped_steps={self.skipped_steps}, enabled={self.enabled})"
        )
