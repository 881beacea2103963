"""Adapters that give a state by global name for objects whose state needs arguments."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from collectives import InvalidArgumentError

from ._shard import Placement, placed

__all__ = ["OptimizerState", "Placed"]


class OptimizerState:
    """The state of a plain optimizer (``ddp.SGD``, ``ddp.AdamW``) used with ``opt.step(params,
    grads, states)``: ``{"step": n, "exp_avg": {name: ...}, ...}``, the names ``ZeroOptimizer``
    gives, so a checkpoint moves between the two.

    States not created yet are created (zeros) so that a load has arrays to fill.

    Example::

        state = {"model": {"params": ddp, "optim": OptimizerState(opt, params, states)}}
        checkpoint.save("ckpt", state, comm, step=3)
    """

    def __init__(
        self,
        optimizer: Any,
        params: Mapping[str, Any],
        states: dict[str, Any],
        placements: Optional[Mapping[str, Placement]] = None,
    ) -> None:
        self.optimizer, self.params, self.states = optimizer, params, states
        self.placements = placements

    def state_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        steps = set()
        for name, param in self.params.items():
            if name not in self.states:
                self.states[name] = _new_state(self.optimizer, param)
            for key, value in self.states[name].items():
                if key == "step":
                    steps.add(int(value))
                elif hasattr(value, "shape"):
                    out.setdefault(key, {})[name] = placed(value, name, self.placements)
                else:
                    raise InvalidArgumentError(
                        f"OptimizerState: states[{name!r}][{key!r}] is a "
                        f"{type(value).__name__}, expected an array or the step counter"
                    )
        if len(steps) > 1:
            raise InvalidArgumentError(
                f"OptimizerState: the parameters are at different steps {sorted(steps)}, "
                "expected one step for all"
            )
        out["step"] = steps.pop() if steps else 0
        return out

    def load_state_dict(self, loaded: Mapping[str, Any]) -> None:
        for name in self.params:
            self.states[name]["step"] = int(loaded["step"])


def _new_state(optimizer: Any, param: Any) -> dict[str, Any]:
    """A parameter's state as the optimizer's first step makes it: half-precision parameters
    get a float32 master copy (``"master"``) beside the optimizer state, which follows it."""
    if str(getattr(param, "dtype", "")) in ("float16", "bfloat16"):
        master = param.astype("float32")
        return {**optimizer.init_state(master), "master": master}
    return dict(optimizer.init_state(param))


class Placed:
    """``obj.state_dict(placements)`` as a stateful object, for a state that takes
    placements (``DistributedDataParallel``, ``ZeroOptimizer``) of tensor-parallel blocks.

    Example: ``{"model": Placed(zero, {"w": ((8, 24), (0, 12))})}``.
    """

    def __init__(self, obj: Any, placements: Mapping[str, Placement]) -> None:
        self.obj, self.placements = obj, placements

    def state_dict(self) -> dict[str, Any]:
        return dict(self.obj.state_dict(self.placements))

    def load_state_dict(self, loaded: Mapping[str, Any]) -> None:
        if hasattr(self.obj, "load_state_dict"):
            self.obj.load_state_dict(loaded)
