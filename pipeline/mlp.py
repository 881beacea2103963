"""A dense network with explicit forward and backward, cut into pipeline stages.

The reference workload of the pipeline tests, example and benchmark: plain NumPy or CuPy
(whichever the weights are), no autograd. A :class:`Dense` layer can split its backward
into the input-gradient half and the weight-gradient half, as zero-bubble schedules want.

Example:
    >>> rng = np.random.default_rng(0)
    >>> layers = [Dense(w, b) for w, b in init_weights([4, 8, 8, 2], rng)]
    >>> stage = Chain(layers[:2]).stage(split=False)   # a pipeline.Stage
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from collectives import array_module

from ._stage import Stage


def init_weights(sizes: Sequence[int], rng: np.random.Generator, dtype=np.float64, xp=np):
    """``[(w, b), ...]`` for layers ``sizes[i] -> sizes[i + 1]``, scaled 1/sqrt(fan-in)."""
    out = []
    for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
        w = rng.standard_normal((fan_in, fan_out)) / np.sqrt(fan_in)
        b = 0.1 * rng.standard_normal(fan_out)
        out.append((xp.asarray(w.astype(dtype)), xp.asarray(b.astype(dtype))))
    return out


class Dense:
    """``y = tanh(x @ w + b)`` (or without tanh: ``activation=None``), gradients in
    ``grad_w`` / ``grad_b``, state per microbatch so several can be in flight."""

    def __init__(self, w: Any, b: Any, activation: str | None = "tanh"):
        self.w, self.b, self.activation = w, b, activation
        self.grad_w = w * 0
        self.grad_b = b * 0
        self._saved: dict[int, tuple] = {}
        self._dz: dict[int, Any] = {}

    def forward(self, x: Any, microbatch: int) -> Any:
        z = x @ self.w + self.b
        y = z if self.activation is None else _tanh(z)
        self._saved[microbatch] = (x, y)
        return y

    def backward(self, dy: Any, microbatch: int, *, split: bool = False) -> Any:
        """``dx``; the weight gradients too unless ``split`` (then :meth:`backward_weight`)."""
        x, y = self._saved[microbatch]
        dz = dy if self.activation is None else dy * (1 - y * y)
        self._dz[microbatch] = dz
        dx = dz @ self.w.T
        if not split:
            self.backward_weight(microbatch)
        return dx

    def backward_weight(self, microbatch: int) -> None:
        x, _ = self._saved.pop(microbatch)
        dz = self._dz.pop(microbatch)
        self.grad_w += x.T @ dz
        self.grad_b += dz.sum(axis=0)

    def zero_grad(self) -> None:
        self.grad_w[...] = 0
        self.grad_b[...] = 0


class Chain:
    """Layers run one after the other: one pipeline stage."""

    def __init__(self, layers: Sequence[Dense]):
        self.layers = list(layers)

    def forward(self, x: Any, microbatch: int) -> Any:
        for layer in self.layers:
            x = layer.forward(x, microbatch)
        return x

    def backward(self, dy: Any, microbatch: int, *, split: bool = False) -> Any:
        for layer in reversed(self.layers):
            dy = layer.backward(dy, microbatch, split=split)
        return dy

    def backward_weight(self, microbatch: int) -> None:
        for layer in reversed(self.layers):
            layer.backward_weight(microbatch)

    def stage(self, split: bool) -> Stage:
        """A :class:`pipeline.Stage`; ``split``: defer weight gradients to ``backward_weight``."""
        if not split:
            return Stage(self.forward, self.backward)
        return Stage(
            self.forward,
            lambda dy, mb: self.backward(dy, mb, split=True),
            self.backward_weight,
        )


def mse(y: Any, target: Any, scale: float = 1.0) -> tuple[Any, Any]:
    """``(loss, dy)`` of ``scale * 0.5 * sum((y - target)**2) / len(y)``."""
    diff = y - target
    n = y.shape[0]
    return scale * 0.5 * float((diff * diff).sum()) / n, diff * (scale / n)


def _tanh(z: Any) -> Any:
    return array_module(z).tanh(z)
