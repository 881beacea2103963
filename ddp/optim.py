"""Optimizer updates written in array code (NumPy or CuPy), pluggable into ZeroOptimizer.

An optimizer is an object with two methods: ``init_state(param) -> dict`` (its per-parameter
state, arrays shaped like ``param``) and ``update(param, grad, state)``, which updates
``param`` and ``state`` in place. Updates are elementwise, so running one on a shard of a
flat parameter space gives exactly the shard of the full update: that is what lets ZeRO
split the state across ranks. The formulas are PyTorch's (``torch.optim.SGD``, ``AdamW``).

Example (plain, unsharded training)::

    opt = AdamW(lr=1e-3)
    states = {}
    for step in range(10):
        grads = compute_grads(params)
        opt.step(params, grads, states)      # every params[name] updated in place
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Protocol

from collectives import InvalidArgumentError, array_module

from ._precision import is_half, round_into, to_float32

__all__ = ["Optimizer", "SGD", "AdamW", "state_nbytes"]


class Optimizer(Protocol):
    """What ZeroOptimizer needs: per-parameter state and an in-place update."""

    def init_state(self, param: Any) -> dict[str, Any]: ...

    def update(self, param: Any, grad: Any, state: dict[str, Any]) -> None: ...


class _Base:
    def step(self, params: Mapping[str, Any], grads: Mapping[str, Any], states: dict) -> None:
        """Update every ``params[name]`` in place from ``grads[name]``; ``states`` fills lazily.

        Half-precision parameters (float16, ``ml_dtypes.bfloat16``, ``as_bfloat16`` bits) are
        updated through a float32 master copy, ``states[name]["master"]``: the gradient is
        taken in float32 (any floating dtype, ideally the float32 one DDP reduced with
        ``reduce_dtype="float32"``), the master and the optimizer state (float32) updated,
        and the parameter rounded from the master. The master is the truth from the first
        step on: to set such a parameter, set its master too (or drop its state).
        """
        for name, param in params.items():
            if name not in states:
                if is_half(param):
                    master = to_float32(param)
                    states[name] = {**self.init_state(master), "master": master}
                else:
                    states[name] = self.init_state(param)
            state = states[name]
            if "master" in state:
                grad = grads[name]
                if is_half(grad):
                    grad = to_float32(grad)
                self.update(state["master"], grad, state)
                round_into(param, state["master"])
            else:
                self.update(param, grads[name], state)

    def init_state(self, param: Any) -> dict[str, Any]:
        raise NotImplementedError

    def update(self, param: Any, grad: Any, state: dict[str, Any]) -> None:
        raise NotImplementedError


def state_nbytes(states: Mapping[str, Any]) -> int:
    """Bytes of the arrays in ``states`` (what ``step`` filled: optimizer state and masters).

    Example: AdamW on float16 parameters holds 4 (master) + 8 (moments) = 12 bytes each.
    """
    return sum(
        int(v.nbytes) for state in states.values() for v in state.values() if hasattr(v, "nbytes")
    )


def _check_positive(call: str, name: str, value: float, *, allow_zero: bool = True) -> None:
    if not (value >= 0 if allow_zero else value > 0) or math.isnan(value):
        bound = ">= 0" if allow_zero else "> 0"
        raise InvalidArgumentError(f"{call}: {name} must be {bound}, got {value}")


class SGD(_Base):
    """Stochastic gradient descent with momentum, dampening, Nesterov and weight decay.

    ``g = grad + weight_decay * param``; with momentum ``buf = momentum * buf + (1 -
    dampening) * g`` (``buf = g`` on the first step), ``g = buf`` (or ``g + momentum * buf``
    with Nesterov); then ``param -= lr * g``.

    Example: ``SGD(lr=0.1, momentum=0.9).update(w, dw, state)``.
    """

    def __init__(
        self,
        lr: float,
        momentum: float = 0.0,
        *,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        for name, value in (
            ("lr", lr),
            ("momentum", momentum),
            ("dampening", dampening),
            ("weight_decay", weight_decay),
        ):
            _check_positive("SGD", name, value)
        if nesterov and (momentum == 0 or dampening != 0):
            raise InvalidArgumentError(
                f"SGD: nesterov=True needs momentum > 0 and dampening == 0, got momentum="
                f"{momentum}, dampening={dampening}"
            )
        self.lr, self.momentum, self.dampening = lr, momentum, dampening
        self.weight_decay, self.nesterov = weight_decay, nesterov

    def init_state(self, param: Any) -> dict[str, Any]:
        """``{"momentum": zeros}`` with momentum, else nothing; plus a step counter."""
        state: dict[str, Any] = {"step": 0}
        if self.momentum:
            state["momentum"] = array_module(param).zeros_like(param)
        return state

    def update(self, param: Any, grad: Any, state: dict[str, Any]) -> None:
        """One step on ``param`` (in place)."""
        g = grad + self.weight_decay * param if self.weight_decay else grad
        if self.momentum:
            buf = state["momentum"]
            if state["step"] == 0:
                buf[...] = g
            else:
                buf *= self.momentum
                buf += (1 - self.dampening) * g
            g = g + self.momentum * buf if self.nesterov else buf
        state["step"] += 1
        param -= self.lr * g


class AdamW(_Base):
    """Adam with decoupled weight decay (Adam itself when ``weight_decay=0``).

    ``param *= 1 - lr * weight_decay``; ``m = b1 m + (1 - b1) g``; ``v = b2 v + (1 - b2) g^2``;
    ``param -= lr / (1 - b1^t) * m / (sqrt(v / (1 - b2^t)) + eps)``.

    Example: ``AdamW(lr=1e-3, weight_decay=0.01).update(w, dw, state)``.
    """

    def __init__(
        self,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        _check_positive("AdamW", "lr", lr)
        _check_positive("AdamW", "eps", eps)
        _check_positive("AdamW", "weight_decay", weight_decay)
        if len(betas) != 2 or not all(0.0 <= b < 1.0 for b in betas):
            raise InvalidArgumentError(f"AdamW: betas must be two numbers in [0, 1), got {betas}")
        self.lr, self.betas, self.eps, self.weight_decay = lr, tuple(betas), eps, weight_decay

    def init_state(self, param: Any) -> dict[str, Any]:
        """First and second moments (zeros shaped like ``param``) and a step counter."""
        xp = array_module(param)
        return {"step": 0, "exp_avg": xp.zeros_like(param), "exp_avg_sq": xp.zeros_like(param)}

    def update(self, param: Any, grad: Any, state: dict[str, Any]) -> None:
        """One step on ``param`` (in place)."""
        xp = array_module(param)
        b1, b2 = self.betas
        state["step"] += 1
        t = state["step"]
        m, v = state["exp_avg"], state["exp_avg_sq"]
        if self.weight_decay:
            param *= 1 - self.lr * self.weight_decay
        m *= b1
        m += (1 - b1) * grad
        v *= b2
        v += (1 - b2) * grad * grad
        denom = xp.sqrt(v) / math.sqrt(1 - b2**t) + self.eps
        param -= (self.lr / (1 - b1**t)) * m / denom
