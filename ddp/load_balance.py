"""Per-rank batch shares proportional to measured throughput, for heterogeneous GPUs.

Each rank reports how long its last step took and how many samples it processed; the
balancer keeps an exponential average of every rank's throughput (samples per second) and
hands out the next global batch in proportion to it, with a floor so that no rank starves
and its throughput stays measurable. Pair it with ``DistributedDataParallel.weight`` so the
uneven shards still give the gradient of the whole batch.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from collectives import CommunicatorLike, InvalidArgumentError

from ._scalars import gather_scalars


def split_batch(fractions: Sequence[float], global_batch: int) -> list[int]:
    """Integer shares of ``global_batch`` closest to ``fractions`` (largest remainder).

    The shares sum to ``global_batch`` exactly; ties go to the lower rank, so the result is
    the same on every rank.

    Example:
        >>> split_batch([0.5, 0.25, 0.25], 10)
        [5, 3, 2]
    """
    total = float(sum(fractions))
    exact = [f / total * global_batch for f in fractions]
    shares = [math.floor(e) for e in exact]
    left = global_batch - sum(shares)
    by_remainder = sorted(range(len(exact)), key=lambda r: (-(exact[r] - shares[r]), r))
    for r in by_remainder[:left]:
        shares[r] += 1
    return shares


def floored_fractions(throughputs: Sequence[float], floor: float) -> list[float]:
    """Fractions proportional to ``throughputs``, none below ``floor``, summing to 1.

    Ranks under the floor are pinned to it and the rest share what remains in proportion to
    their throughput (repeated until no share is under the floor).

    Example:
        >>> floored_fractions([98.0, 1.0, 1.0], 0.05)
        [0.9, 0.05, 0.05]
    """
    n = len(throughputs)
    pinned: set[int] = set()
    while True:
        free = [r for r in range(n) if r not in pinned]
        budget = 1.0 - floor * len(pinned)
        total = sum(throughputs[r] for r in free)
        fractions = [floor] * n
        for r in free:
            fractions[r] = budget * throughputs[r] / total if total > 0 else budget / len(free)
        under = {r for r in free if fractions[r] < floor}
        if not under:
            return fractions
        pinned |= under


class LoadBalancer:
    """Exponential average of every rank's throughput, turned into per-rank batch shares.

    Args:
        comm: the data-parallel communicator (``None`` to feed all ranks' numbers yourself
            with :meth:`observe`, as the tests do).
        global_batch: samples per step over all ranks.
        smoothing: weight of the newest measurement in the exponential average (0 < s <= 1).
        floor: smallest fraction of the global batch any rank gets.
        size: number of ranks when ``comm`` is None.

    Example:
        >>> import time
        >>> from ddp import DistributedDataParallel
        >>> ddp = DistributedDataParallel(params, comm)
        >>> def train_step(n):                      # forward and backward of n samples
        ...     ddp.zero_grad()
        >>> lb = LoadBalancer(comm, global_batch=256)
        >>> for step in range(3):
        ...     n = lb.local_batch                  # this rank's share
        ...     ddp.weight = lb.weight              # n / 256
        ...     t0 = time.perf_counter(); train_step(n); ddp.finish()
        ...     shares = lb.record(time.perf_counter() - t0, n)
        >>> shares                                  # every rank's share of the next step
        [256]
    """

    def __init__(
        self,
        comm: CommunicatorLike,
        global_batch: int,
        *,
        smoothing: float = 0.3,
        floor: float = 0.05,
        size: int | None = None,
    ):
        if comm is None and size is None:
            raise InvalidArgumentError("LoadBalancer: size is required when comm is None")
        self.comm = comm
        self.size = comm.size if comm is not None else int(size)  # type: ignore[arg-type]
        self.rank = comm.rank if comm is not None else 0
        if self.size < 1:
            raise InvalidArgumentError(f"LoadBalancer: size must be >= 1, got {self.size}")
        if int(global_batch) != global_batch or global_batch < self.size:
            raise InvalidArgumentError(
                f"LoadBalancer: global_batch must be an integer >= size ({self.size}), got {global_batch}"
            )
        if not 0.0 < smoothing <= 1.0:
            raise InvalidArgumentError(
                f"LoadBalancer: smoothing must be in (0, 1], got {smoothing}"
            )
        if not 0.0 <= floor <= 1.0 / self.size:
            raise InvalidArgumentError(
                f"LoadBalancer: floor must be in [0, 1/size] = [0, {1.0 / self.size:g}], got {floor}"
            )
        self.global_batch = int(global_batch)
        self.smoothing = float(smoothing)
        self.floor = float(floor)
        #: exponential average of samples per second per rank (None before any measurement)
        self.throughput: list[float] | None = None
        self.shares: list[int] = split_batch([1.0] * self.size, self.global_batch)

    @property
    def local_batch(self) -> int:
        """This rank's number of samples for the next step."""
        return self.shares[self.rank]

    @property
    def weight(self) -> float:
        """This rank's fraction of the global batch: the value for ``ddp.weight``."""
        return self.local_batch / self.global_batch

    def observe(self, step_times: Sequence[float], samples: Sequence[int]) -> list[int]:
        """Fold in every rank's last step time and sample count; return the new shares."""
        if len(step_times) != self.size or len(samples) != self.size:
            raise InvalidArgumentError(
                f"LoadBalancer.observe: expected {self.size} step times and sample counts, "
                f"got {len(step_times)} and {len(samples)}"
            )
        bad = [t for t in step_times if not (t > 0 and math.isfinite(t))]
        if bad:
            raise InvalidArgumentError(
                f"LoadBalancer.observe: step times must be > 0, got {bad[0]}"
            )
        measured = [n / t for n, t in zip(samples, step_times)]
        if self.throughput is None:
            self.throughput = measured
        else:
            s = self.smoothing
            self.throughput = [s * m + (1 - s) * old for m, old in zip(measured, self.throughput)]
        fractions = floored_fractions(self.throughput, self.floor)
        self.shares = split_batch(fractions, self.global_batch)
        return self.shares

    def record(self, step_time: float, samples: int) -> list[int]:
        """Collective: share this rank's last step time and sample count, update the shares."""
        if self.comm is None:
            raise InvalidArgumentError(
                "LoadBalancer.record: needs a communicator; use observe() without one"
            )
        every = gather_scalars(self.comm, [step_time, samples])
        return self.observe(every[:, 0].tolist(), [int(n) for n in every[:, 1]])

    # -- checkpoint state (ddp.checkpoint)

    def state_dict(self) -> dict[str, Any]:
        """The measured throughputs and the current shares (JSON; the same on every rank).

        Example: ``checkpoint.save("ckpt", {"balancer": lb}, comm, step=0)``.
        """
        return {"throughput": self.throughput, "shares": list(self.shares)}

    def load_state_dict(self, loaded: Mapping[str, Any]) -> None:
        """Take the loaded throughputs; shares are recomputed for this world size."""
        throughput = loaded["throughput"]
        if throughput is not None and len(throughput) == self.size:
            self.throughput = [float(t) for t in throughput]
            fractions = floored_fractions(self.throughput, self.floor)
            self.shares = split_batch(fractions, self.global_batch)
        else:  # none measured yet, or of another world size's ranks: start afresh
            self.throughput = None
            self.shares = split_batch([1.0] * self.size, self.global_batch)
