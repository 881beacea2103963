"""The bucket cap chosen by measurement: ``tune_bucket_cap`` and ``bucket_cap_mb="auto"``.

Each candidate cap gives the model's gradients another bucket layout (``assign_buckets``);
each layout's reduction is timed for real, every bucket all-reduced as DDP's default hook
does, on every rank. Rank 0 picks the cap of its fastest median and broadcasts it, so that
every rank builds the same buckets.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np

from collectives import CommunicatorLike, InvalidArgumentError, array_module

from . import hooks
from ._buckets import BucketSpec, _describe, assign_buckets
from ._param_check import check_params_agree

_CALL = "tune_bucket_cap"
DEFAULT_CAPS_MB = (1.0, 5.0, 10.0, 25.0, 50.0, 100.0)


@dataclass(frozen=True)
class BucketCapTuning:
    """What :func:`tune_bucket_cap` measured, and what it chose.

    Attributes:
        caps_mb: the candidate caps, in MiB, in the order given.
        buckets: how many buckets each cap makes of the model's gradients.
        seconds: rank 0's median time of one bucketed reduction per cap (the basis of the
            choice; the same on every rank).
        local_seconds: this rank's median per cap.
        cap_mb: the chosen cap (rank 0's fastest), the same on every rank.
        nbytes: the bytes of gradients reduced per timing.
        rounds: timings per cap (after one warm-up).
        size: ranks of the communicator.
    """

    caps_mb: tuple[float, ...]
    buckets: tuple[int, ...]
    seconds: tuple[float, ...]
    local_seconds: tuple[float, ...]
    cap_mb: float
    nbytes: int
    rounds: int
    size: int

    def __str__(self) -> str:
        lines = [
            f"bucket cap tuning: {self.nbytes / 2**20:.1f} MiB of gradients, {self.size} "
            f"ranks, median of {self.rounds} reductions per cap (rank 0's)",
            f"{'cap MB':>8} {'buckets':>8} {'ms':>10}",
        ]
        for cap, count, seconds in zip(self.caps_mb, self.buckets, self.seconds):
            chosen = "  <- chosen" if cap == self.cap_mb else ""
            lines.append(f"{cap:8g} {count:8d} {seconds * 1e3:10.3f}{chosen}")
        return "\n".join(lines)


def tune_bucket_cap(
    comm: CommunicatorLike,
    params: Mapping[str, Any],
    caps_mb: Sequence[float] = DEFAULT_CAPS_MB,
    *,
    first_bucket_cap_mb: float = 1.0,
    rounds: int = 5,
    check: bool = True,
) -> BucketCapTuning:
    """Time the bucketed reduction of ``params``' gradients at each cap; return rank 0's
    fastest, the same on every rank, with what was measured.

    Collective: every rank calls it with the same parameters (names, shapes, dtypes;
    checked across ranks unless ``check=False``). ``params`` maps names, in model order, to
    arrays or ``(shape, dtype)`` pairs. For each cap the layout of
    :func:`ddp.assign_buckets` is reduced once to warm up, then ``rounds`` times, timed:
    all of its buckets started asynchronously (the default hook's all-reduce to the mean,
    as when ``finish()`` starts every bucket) and waited for, from a barrier. The caps are
    timed in turns, alternating their order, so that noise hits them alike. It allocates one
    set of gradient buffers, shared by every layout. The timings use the default hook: with
    a compression hook the best cap may differ.

    Example:
        >>> import ddp
        >>> tuning = ddp.tune_bucket_cap(comm, params, caps_mb=(1, 5, 25))
        >>> print(tuning)                  # a table of caps, buckets and times
        bucket cap tuning: 0.0 MiB of gradients, 1 ranks, median of 5 reductions per cap (rank 0's)
          cap MB  buckets         ms
               1        1 ...
               5        1 ...
              25        1 ...
        >>> model = ddp.DistributedDataParallel(params, comm, bucket_cap_mb=tuning.cap_mb)
    """
    if not isinstance(params, Mapping) or len(params) == 0:
        raise InvalidArgumentError(
            f"{_CALL}: params must be a non-empty mapping name -> array, got {params!r:.80}"
        )
    caps = tuple(caps_mb) if isinstance(caps_mb, Sequence) else ()
    if not caps or not all(
        isinstance(c, (int, float)) and not isinstance(c, bool) and 0 < c < math.inf for c in caps
    ):
        raise InvalidArgumentError(
            f"{_CALL}: caps_mb must be a non-empty sequence of positive MiB, got {caps_mb!r}"
        )
    if type(rounds) is not int or rounds < 1:
        raise InvalidArgumentError(f"{_CALL}: rounds must be a positive int, got {rounds!r}")
    described = {name: SimpleNamespace(**_shape_dtype(v)) for name, v in params.items()}
    layouts = [assign_buckets(params, float(c), first_bucket_cap_mb) for c in caps]
    xp = _array_module(comm, params)
    if check:
        check_params_agree(comm, described, _CALL)
    buffers = _layout_buffers(layouts, described, xp, comm)
    for views in buffers:  # warm-up
        _reduce(comm, views)
    times: list[list[float]] = [[] for _ in caps]
    for r in range(rounds):
        order = range(len(caps)) if r % 2 == 0 else reversed(range(len(caps)))
        for i in order:
            times[i].append(_timed(comm, buffers[i]))
    local = tuple(statistics.median(t) for t in times)
    with _on_device(xp, comm):
        chosen = xp.asarray(np.array([float(np.argmin(local)), *local]))
    comm.broadcast(chosen, root=0)
    decided = chosen if xp is np else chosen.get()
    index = int(decided[0])
    return BucketCapTuning(
        caps_mb=tuple(float(c) for c in caps),
        buckets=tuple(len(layout) for layout in layouts),
        seconds=tuple(float(s) for s in decided[1:]),
        local_seconds=local,
        cap_mb=float(caps[index]),
        nbytes=sum(spec.nbytes for spec in layouts[0]),
        rounds=rounds,
        size=comm.size,
    )


def _shape_dtype(value: Any) -> dict[str, Any]:
    shape, dtype = _describe(value)
    return {"shape": shape, "dtype": dtype}


def _array_module(comm: CommunicatorLike, params: Mapping[str, Any]) -> Any:
    """The module of the parameters where they are arrays, else the backend's."""
    first = next(iter(params.values()))
    if hasattr(first, "shape") and hasattr(first, "dtype"):
        return array_module(first)
    return comm.xp


def _layout_buffers(
    layouts: list[list[BucketSpec]], described: Mapping[str, Any], xp: Any, comm: CommunicatorLike
) -> list[list[Any]]:
    """Per layout, its buckets as views of one flat buffer per dtype (all layouts share
    them: every layout of a dtype covers the same parameters)."""
    numel: dict[np.dtype, int] = {}
    for p in described.values():
        numel[p.dtype] = numel.get(p.dtype, 0) + math.prod(p.shape)
    with _on_device(xp, comm):
        flat = {dtype: xp.zeros(n, dtype) for dtype, n in numel.items()}
    result = []
    for layout in layouts:
        offset = dict.fromkeys(numel, 0)
        views = []
        for spec in layout:
            start = offset[spec.dtype]
            offset[spec.dtype] = start + spec.numel
            views.append(SimpleNamespace(buffer=flat[spec.dtype][start : start + spec.numel]))
        result.append(views)
    return result


def _on_device(xp: Any, comm: CommunicatorLike) -> Any:
    """Where new arrays go: the communicator's GPU (CuPy), or nowhere in particular."""
    if xp is np or getattr(comm, "device", None) is None:
        return contextlib.nullcontext()
    return xp.cuda.Device(comm.device)


def _reduce(comm: CommunicatorLike, buckets: list[Any]) -> None:
    works = [hooks.allreduce(comm, bucket) for bucket in buckets]
    for work in works:
        work.synchronize()


def _timed(comm: CommunicatorLike, buckets: list[Any]) -> float:
    comm.barrier()
    start = time.perf_counter()
    _reduce(comm, buckets)
    return time.perf_counter() - start
