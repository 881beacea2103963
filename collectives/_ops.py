"""Reduce operations: the public enum and the one lookup that accepts strings too."""

from __future__ import annotations

import enum

from ._errors import invalid


class ReduceOp(enum.Enum):
    """Reduction applied across ranks. Strings ``"sum"``... are accepted wherever an op is."""

    SUM = "sum"
    PROD = "prod"
    MAX = "max"
    MIN = "min"
    AVG = "avg"

    def __str__(self) -> str:
        return self.value


_BY_NAME = {op.value: op for op in ReduceOp}
_BY_NAME.update({op: op for op in ReduceOp})


def parse_op(op: ReduceOp | str, call: str) -> ReduceOp:
    """``"sum"`` or ``ReduceOp.SUM`` -> ``ReduceOp.SUM``; anything else is a clear error."""
    try:
        return _BY_NAME[op]
    except (KeyError, TypeError):
        pass
    if isinstance(op, str) and op.lower() in _BY_NAME:
        return _BY_NAME[op.lower()]
    raise invalid(call, f"op must be one of sum, prod, max, min, avg, got {op!r}")
