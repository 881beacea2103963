"""Local SGD: ranks step on their own and average their parameters every ``period`` steps."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from collectives import CommunicatorLike, InvalidArgumentError, array_module, to_array

from ._buckets import assign_buckets, make_buckets
from ._pack import _PointerTable, pack, unpack


class LocalSGD:
    """Periodic parameter averaging: the bounded-staleness alternative to per-step all-reduce.

    Each rank runs its optimizer on its own gradients; every ``period`` calls of :meth:`step`
    the parameters are averaged over ``comm``, so no rank drifts more than ``period`` steps
    from the others (Stich, 2019; Lin et al., 2020 "post-local SGD": use ``warmup_steps`` of
    averaging every step before going local). Parameters are averaged through flat buffers,
    one all-reduce per dtype-bucket.

    Args:
        params: name -> array (or a sequence of arrays), updated in place.
        comm: the data-parallel communicator.
        period: steps between averages (1 averages every step).
        warmup_steps: steps at the start that average every step.
        broadcast_from: rank whose parameters everyone starts from (None: skip).
        bucket_cap_mb: size of the flat buffers used for averaging.

    Example:
        >>> local = LocalSGD(params, comm, period=8)
        >>> for batch in range(16):
        ...     params["w"] -= 0.1 * params["w"]        # an optimizer step: purely local
        ...     averaged = local.step()                 # True every 8th call: averaged
        >>> local.averages
        2
    """

    def __init__(
        self,
        params: Any,
        comm: CommunicatorLike,
        period: int = 4,
        *,
        warmup_steps: int = 0,
        broadcast_from: int | None = 0,
        bucket_cap_mb: float = 25.0,
    ):
        call = "LocalSGD"
        if int(period) != period or period < 1:
            raise InvalidArgumentError(f"{call}: period must be an integer >= 1, got {period}")
        if int(warmup_steps) != warmup_steps or warmup_steps < 0:
            raise InvalidArgumentError(
                f"{call}: warmup_steps must be an integer >= 0, got {warmup_steps}"
            )
        if broadcast_from is not None and not (0 <= broadcast_from < comm.size):
            raise InvalidArgumentError(
                f"{call}: broadcast_from must be None or in [0, {comm.size}), got {broadcast_from}"
            )
        items = params.items() if isinstance(params, Mapping) else enumerate(params)
        self.params = {str(k): to_array(v, call, f"params[{k!r}]") for k, v in items}
        if not self.params:
            raise InvalidArgumentError(f"{call}: params is empty, expected at least one array")
        self.comm = comm
        self.period = int(period)
        self.warmup_steps = int(warmup_steps)
        self.steps = 0
        self.averages = 0
        first = next(iter(self.params.values()))
        xp = array_module(first)
        specs = assign_buckets(self.params, bucket_cap_mb, bucket_cap_mb)
        self._buckets = make_buckets(specs, xp)
        self._tables = [_PointerTable() for _ in self._buckets]
        if broadcast_from is not None:
            self._exchange(lambda buf: comm.broadcast(buf, root=broadcast_from, async_op=True))

    def step(self) -> bool:
        """Count one local step; average the parameters if this step ends a period.

        Returns True when it averaged (a collective: every rank calls ``step`` equally often).
        """
        self.steps += 1
        if self.steps <= self.warmup_steps or (self.steps - self.warmup_steps) % self.period == 0:
            self.average()
            return True
        return False

    def average(self) -> None:
        """Average the parameters over ranks now (a collective)."""
        self._exchange(lambda buf: self.comm.all_reduce(buf, op="avg", async_op=True))
        self.averages += 1

    def _exchange(self, start: Any) -> None:
        works = []
        for bucket, table in zip(self._buckets, self._tables):
            pack(bucket, [self.params[n] for n in bucket.names], table)
            works.append(start(bucket.buffer))
        for bucket, table, work in zip(self._buckets, self._tables, works):
            work.wait()
            unpack(bucket, [self.params[n] for n in bucket.names], table)
