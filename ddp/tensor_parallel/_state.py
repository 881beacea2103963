"""What a tensor-parallel layer keeps between its forward, backward and backward_weight, per
microbatch, so that a pipeline schedule can have several microbatches in flight and run the
weight-gradient half (W) of a backward later than its input-gradient half (I or B).

Keys are whatever the caller passes as ``microbatch`` (``pipeline.Stage`` passes the
microbatch index); ``None`` is the key of a call that gives none (one batch at a time).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from collectives import InvalidArgumentError


class MicrobatchState:
    """Saved inputs (forward to backward) and deferred weight-gradient work (backward to
    backward_weight) of one layer, keyed by microbatch.

        >>> state = MicrobatchState("Layer")
        >>> state.save(3, "x")
        >>> state.take(3)
        'x'
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._saved: dict[Hashable, Any] = {}
        self._deferred: dict[Hashable, Any] = {}

    def save(self, microbatch: Hashable, value: Any) -> None:
        self._saved[microbatch] = value

    def peek(self, microbatch: Hashable) -> Any:
        """What forward saved for ``microbatch``, kept (for checks that may still refuse)."""
        if microbatch not in self._saved:
            raise InvalidArgumentError(
                f"{self.owner}.backward: no saved input for microbatch {microbatch!r}, "
                f"expected forward(x, {microbatch!r}) first"
            )
        return self._saved[microbatch]

    def take(self, microbatch: Hashable) -> Any:
        """What forward saved for ``microbatch`` (forgotten once taken)."""
        value = self.peek(microbatch)
        del self._saved[microbatch]
        return value

    def defer(self, microbatch: Hashable, value: Any) -> None:
        self._deferred[microbatch] = value

    def finish(self, microbatch: Hashable) -> Any:
        """What a ``split=True`` backward left for ``backward_weight(microbatch)``."""
        if microbatch not in self._deferred:
            raise InvalidArgumentError(
                f"{self.owner}.backward_weight: nothing deferred for microbatch "
                f"{microbatch!r}, expected backward(dy, {microbatch!r}, split=True) first"
            )
        return self._deferred.pop(microbatch)

    @property
    def in_flight(self) -> int:
        """Microbatches whose forward or weight gradient is still owed."""
        return len(self._saved.keys() | self._deferred.keys())


def add_grad(current: Any, value: Any, microbatch: Hashable) -> Any:
    """The gradient after one more contribution: a call keyed by a microbatch adds to the
    sum since ``zero_grad()``, in place (so ``grad_weight`` may be bound to an array of the
    caller's, a DDP bucket's view or its transpose); an unkeyed call (one batch at a time)
    replaces it."""
    if value is None or microbatch is None or current is None:
        return value
    current += value
    return current


def zero(grad: Any) -> Any:
    """``grad`` zeroed in place (None stays None)."""
    if grad is not None:
        grad[...] = 0
    return grad
