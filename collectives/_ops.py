"""Reduce operations: the public enum and the one lookup that accepts strings too."""

from __future__ import annotations

import enum

from ._errors import InvalidArgumentError


class ReduceOp(enum.IntEnum):
    """Reduction applied across ranks; strings ``"sum"``, ``"avg"``... are accepted too.

    The values are NCCL's ``ncclRedOp_t`` codes. (An ``IntEnum`` also hashes at C speed,
    which matters on the per-call path.)
    """

    SUM = 0
    PROD = 1
    MAX = 2
    MIN = 3
    AVG = 4

    def __str__(self) -> str:
        return self.name.lower()


#: the members as module globals, for the per-call paths: an enum class's attribute is read
#: through its metaclass, several times slower than a global on Python 3.11
SUM, MAX, MIN, AVG = ReduceOp.SUM, ReduceOp.MAX, ReduceOp.MIN, ReduceOp.AVG
#: the reductions that pick one rank's value (NCCL's lose NaNs: :mod:`collectives._nccl.nan`)
MAX_OR_MIN = frozenset({MAX, MIN})

BY_NAME: dict = {op.name.lower(): op for op in ReduceOp}
BY_NAME.update({op: op for op in ReduceOp})


def parse_op(op: ReduceOp | str, call: str) -> ReduceOp:
    """``"sum"`` or ``ReduceOp.SUM`` -> ``ReduceOp.SUM``; anything else is a clear error."""
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str) and op.lower() in BY_NAME:
        return BY_NAME[op.lower()]
    raise InvalidArgumentError(f"{call}: op must be one of sum, prod, max, min, avg, got {op!r}")
