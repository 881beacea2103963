"""A stage of the model as the runtime sees it: explicit forward and backward callables."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional


@dataclass
class Stage:
    """One model chunk on this rank.

    Args:
        forward: ``forward(x, microbatch) -> y``; keeps what its backward will need.
        backward: ``backward(dy, microbatch) -> dx``; accumulates the parameter gradients,
            or, where ``backward_weight`` is given, only computes ``dx``.
        backward_weight: ``backward_weight(microbatch)``: the weight gradients of a backward
            whose ``dx`` is done. Zero-bubble schedules run it later (their W actions);
            other schedules run it right after ``backward``.

    The runtime reuses the buffers it passes in as ``x`` and ``dy`` once this stage's last
    backward call for that microbatch has returned: copy anything kept beyond that.

    Example:
        >>> stage = Stage(lambda x, mb: 2 * x, lambda dy, mb: 2 * dy)
    """

    forward: Callable[[Any, int], Any]
    backward: Callable[[Any, int], Any]
    backward_weight: Optional[Callable[[int], None]] = None
