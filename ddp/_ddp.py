"""DistributedDataParallel: starts and finishes the reductions of the bucket layout."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from collectives import CommunicatorLike, InvalidArgumentError, array_module, to_array
from collectives.timeline import span as timeline_span

from . import hooks as _hooks
from ._buckets import Bucket, assign_buckets, make_buckets
from ._pack import _PointerTable, pack, unpack
from ._param_check import check_params_agree
from ._precision import dtype_label, is_half, round_into, to_float32
from ._tune import tune_bucket_cap
from .checkpoint._shard import placed

_CALL = "DistributedDataParallel"


@dataclass
class BucketStats:
    """One bucket's reduction in the last step: bytes, and start/end in seconds since the
    step's first reduction started (GPU: measured with CUDA events)."""

    index: int
    nbytes: int
    start_s: float = math.nan
    end_s: float = math.nan


@dataclass
class DDPStats:
    """Per-bucket bytes and timings of the last synchronized step, and time spent waiting.

    ``wait_s`` is the time the caller spent blocked in the last ``finish()`` (or
    ``sync_gradients``); ``total_wait_s`` sums it over every step; ``steps`` counts them.
    """

    buckets: list[BucketStats] = field(default_factory=list)
    wait_s: float = 0.0
    total_wait_s: float = 0.0
    steps: int = 0


class _Clock:
    """Host timestamps, or CUDA events on GPU (read back lazily, when stats are asked for)."""

    def __init__(self, xp: Any, comm: CommunicatorLike):
        self._cuda = xp is not np
        self._comm = comm
        self._origin: Any = None
        self._stream: Any = None  # waits on completion events, to stamp them with a time
        self.marks: dict[tuple[int, str], Any] = {}

    def reset(self) -> None:
        self._origin = None
        self.marks = {}

    def mark(self, index: int, what: str) -> None:
        if self._cuda:
            import cupy

            stream = self._comm.stream if what == "end" and self._comm.stream is not None else None
            event = cupy.cuda.Event()
            event.record(stream)
            stamp: Any = event
        else:
            stamp = time.perf_counter()
        if self._origin is None:
            self._origin = stamp
        self.marks[(index, what)] = stamp

    def mark_completion(self, index: int, work: Any) -> None:
        """Bucket ``index`` ends when its work's own completion event does (NCCL), not when
        the caller gets round to waiting, by which time later buckets are queued too."""
        event = (
            getattr(work, "event", None) if self._cuda else None
        )  # a hook may return any Work-like
        device = getattr(self._comm, "device", None)
        if event is None or device is None:
            return
        import cupy

        # The completion event has no timing; a timed event on a stream that waits for it
        # is stamped as it completes.
        with cupy.cuda.Device(device):
            if self._stream is None:
                self._stream = cupy.cuda.Stream(non_blocking=True)
            self._stream.wait_event(event)
            stamp = cupy.cuda.Event()
            stamp.record(self._stream)
        self.marks[(index, "end")] = stamp

    def seconds(self, index: int, what: str) -> float:
        stamp = self.marks.get((index, what))
        if stamp is None:
            return math.nan
        if self._cuda:
            import cupy

            stamp.synchronize()
            return cupy.cuda.get_elapsed_time(self._origin, stamp) / 1e3
        return stamp - self._origin


class DistributedDataParallel:
    """Data-parallel gradient reduction over bucketed flat buffers.

    Args:
        params: name -> array, in model order (NumPy or CuPy, all alike).
        comm: the data-parallel communicator.
        bucket_cap_mb: cap of every bucket but the first of each dtype, in MiB, or
            ``"auto"``: the fastest of :func:`ddp.tune_bucket_cap`'s default candidates,
            timed here on every rank (rank 0's choice; ``ddp.tuning`` says what it measured).
        first_bucket_cap_mb: cap of the first bucket of each dtype (starts communication early).
        broadcast_from: rank whose parameters every rank starts from (None: skip).
        hook: ``hook(comm, bucket) -> work`` leaving the mean in ``bucket.buffer``
            (default :func:`ddp.hooks.allreduce`).
        reduce_dtype: None (buckets in the gradients' dtype) or ``"float32"``: the
            gradients of half-precision parameters (float16, ``ml_dtypes.bfloat16``,
            ``as_bfloat16`` bits, which need it) live and are reduced in float32 buckets, at
            4 bytes per parameter instead of 2; other parameters keep their dtype.

    Example:
        >>> ddp = DistributedDataParallel(params, comm, bucket_cap_mb=25)
        >>> def backward(x, y):                      # a model's gradients, last layers first
        ...     yield "b", np.full(3, y, np.float32)
        ...     yield "w", np.full((2, 3), x, np.float32)
        >>> lr, batches = 0.5, [(1.0, 2.0), (3.0, 4.0)]
        >>> for x, y in batches:
        ...     ddp.zero_grad()
        ...     for name, g in backward(x, y):        # last layers first
        ...         ddp.grads[name][...] += g
        ...         ddp.mark_ready(name)             # may start a bucket's reduction
        ...     ddp.finish()                         # grads now hold the mean over ranks
        ...     for name, p in params.items():
        ...         p -= lr * ddp.grads[name]
        >>> params["b"]
        array([-3., -3., -3.], dtype=float32)
    """

    def __init__(
        self,
        params: Mapping[str, Any],
        comm: CommunicatorLike,
        *,
        bucket_cap_mb: float | str = 25.0,
        first_bucket_cap_mb: float = 1.0,
        broadcast_from: int | None = 0,
        hook: Callable[[Any, Bucket], Any] | None = None,
        reduce_dtype: str | None = None,
    ):
        if not isinstance(params, Mapping):
            raise InvalidArgumentError(
                f"{_CALL}: params must be a mapping name -> array, got {type(params).__name__}"
            )
        if len(params) == 0:
            raise InvalidArgumentError(f"{_CALL}: params is empty, expected at least one parameter")
        self.comm = comm
        self.params = {name: to_array(p, _CALL, f"params[{name!r}]") for name, p in params.items()}
        self.reduce_dtype = self._check_reduce_dtype(reduce_dtype)
        self._xp = self._check_arrays()
        # what each gradient is reduced in: the bucket layout is made of these
        described = {name: (tuple(p.shape), self._grad_dtype(p)) for name, p in self.params.items()}
        if broadcast_from is not None and not (
            int(broadcast_from) == broadcast_from and 0 <= broadcast_from < comm.size
        ):
            raise InvalidArgumentError(
                f"{_CALL}: broadcast_from must be None or in [0, {comm.size}), got {broadcast_from}"
            )
        self.hook = _hooks.allreduce if hook is None else hook
        auto = isinstance(bucket_cap_mb, str)
        if auto and bucket_cap_mb != "auto":
            raise InvalidArgumentError(
                f"{_CALL}: bucket_cap_mb must be a number of MiB or 'auto', got {bucket_cap_mb!r}"
            )
        specs = assign_buckets(
            described, 25.0 if auto else float(bucket_cap_mb), first_bucket_cap_mb
        )
        self._check_across_ranks()
        #: what ``bucket_cap_mb="auto"`` measured (a ``BucketCapTuning``), else None
        self.tuning: Any = None
        if auto:
            self.tuning = tune_bucket_cap(
                comm, described, first_bucket_cap_mb=first_bucket_cap_mb, check=False
            )
            specs = assign_buckets(described, self.tuning.cap_mb, first_bucket_cap_mb)
        self.bucket_cap_mb: float = self.tuning.cap_mb if auto else float(bucket_cap_mb)

        with self._on_device():
            self.buckets: list[Bucket] = make_buckets(specs, self._xp)
        self.grads: dict[str, Any] = {}
        self._bucket_of: dict[str, int] = {}
        for bucket in self.buckets:
            for name in bucket.names:
                self._bucket_of[name] = bucket.index
        self.grads = {name: self.buckets[self._bucket_of[name]].views[name] for name in self.params}
        self._tables = [_PointerTable() for _ in self.buckets]

        self._weight: float | None = None
        self._sync = True
        self._open = True
        self._marked: set[str] = set()
        self._missing = [len(b.names) for b in self.buckets]
        self._works: list[Any] = [None] * len(self.buckets)
        self._launched_at: list[float] = [0.0] * len(self.buckets)
        self._next = 0
        self._clock = _Clock(self._xp, comm)
        self._stats = DDPStats(buckets=[BucketStats(b.index, b.nbytes) for b in self.buckets])

        if broadcast_from is not None:
            self._broadcast_params(int(broadcast_from))

    # -- construction helpers -------------------------------------------------------------

    @staticmethod
    def _check_reduce_dtype(reduce_dtype: Any) -> np.dtype | None:
        if reduce_dtype is None:
            return None
        try:
            dtype = np.dtype(reduce_dtype)
        except TypeError:
            dtype = None
        if dtype != np.float32:
            raise InvalidArgumentError(
                f"{_CALL}: reduce_dtype must be None or 'float32', got {reduce_dtype!r}"
            )
        return dtype

    def _grad_dtype(self, param: Any) -> np.dtype:
        if is_half(param) and self.reduce_dtype is not None:
            return self.reduce_dtype
        return np.dtype(param.dtype)

    def _check_arrays(self) -> Any:
        modules = set()
        for name, p in self.params.items():
            if is_half(p):
                if not hasattr(p, "dtype") and self.reduce_dtype is None:
                    raise InvalidArgumentError(
                        f"{_CALL}: params[{name!r}] is bfloat16 bits (as_bfloat16), which "
                        "need reduce_dtype='float32'"
                    )
            elif p.dtype.kind not in "fc":
                raise InvalidArgumentError(
                    f"{_CALL}: params[{name!r}] has dtype {p.dtype}, expected a floating dtype"
                )
            modules.add(array_module(p))
        if len(modules) > 1:
            raise InvalidArgumentError(
                f"{_CALL}: params mix NumPy and CuPy arrays, expected one kind"
            )
        xp = modules.pop()
        if xp is np and self.comm.xp is not np:  # a backend whose calls take device arrays
            raise InvalidArgumentError(
                f"{_CALL}: params are NumPy arrays, expected {self.comm.xp.__name__} arrays "
                "(comm.xp): this communicator's calls take device arrays only"
            )
        return xp

    def _on_device(self) -> Any:
        if self._xp is np or self.comm.device is None:
            return contextlib.nullcontext()
        return self._xp.cuda.Device(self.comm.device)

    def _check_across_ranks(self) -> None:
        check_params_agree(self.comm, self.params, _CALL)

    def _broadcast_params(self, root: int) -> None:
        if self.reduce_dtype is not None and any(is_half(p) for p in self.params.values()):
            # the buckets hold another dtype than the parameters: one broadcast per tensor
            works = [self.comm.broadcast(p, root=root, async_op=True) for p in self.params.values()]
            for work in works:
                work.wait()
            return
        # pack into the (still zero) gradient buffers: one broadcast per bucket, not per tensor
        works = []
        for bucket, table in zip(self.buckets, self._tables):
            pack(bucket, [self.params[n] for n in bucket.names], table)
            works.append(self.comm.broadcast(bucket.buffer, root=root, async_op=True))
        for bucket, table, work in zip(self.buckets, self._tables, works):
            work.wait()
            unpack(bucket, [self.params[n] for n in bucket.names], table)
            bucket.buffer.fill(0)

    # -- the step ---------------------------------------------------------------------------

    @property
    def weight(self) -> float | None:
        """This rank's share of the global batch for the coming reductions (None: plain mean)."""
        return self._weight

    @weight.setter
    def weight(self, value: float | None) -> None:
        self._weight = self._checked_weight(value, "weight")

    @staticmethod
    def _checked_weight(value: Any, call: str) -> float | None:
        if value is None:
            return None
        if not (isinstance(value, (int, float, np.floating, np.integer)) and 0 <= value < math.inf):
            raise InvalidArgumentError(
                f"{call}: weight must be None or a finite number >= 0, got {value!r}"
            )
        return float(value)

    @property
    def stats(self) -> DDPStats:
        """Per-bucket bytes and timings of the last step, and the time waited in ``finish``."""
        for s in self._stats.buckets:
            s.start_s = self._clock.seconds(s.index, "start")
            s.end_s = self._clock.seconds(s.index, "end")
        return self._stats

    def zero_grad(self) -> None:
        """Zero every gradient (the flat buffers) and begin a new step."""
        for bucket in self.buckets:
            bucket.buffer.fill(0)
        self._open = True

    def mark_ready(self, name: str) -> None:
        """Declare ``name``'s gradient final; a bucket whose gradients are all final starts
        its reduction at once (buckets always start in order, the same on every rank)."""
        index = self._bucket_of.get(name)
        if index is None:
            raise InvalidArgumentError(
                f"mark_ready: name {name!r} is not one of the {len(self.params)} parameters"
            )
        if name in self._marked:
            raise InvalidArgumentError(
                f"mark_ready: gradient {name!r} was already marked ready in this step (call finish() first)"
            )
        self._marked.add(name)
        self._open = True
        self._missing[index] -= 1
        if self._sync:
            while self._next < len(self.buckets) and self._missing[self._next] == 0:
                self._launch(self._next, self._weight)

    def _launch(self, index: int, weight: float | None) -> None:
        bucket = self.buckets[index]
        if index == 0:
            self._clock.reset()
        if weight is not None:
            # the hook averages, so scale by weight * size to get the weighted sum
            bucket.buffer *= bucket.dtype.type(weight * self.comm.size)
        self._clock.mark(index, "start")
        self._launched_at[index] = time.monotonic()
        self._works[index] = self.hook(self.comm, bucket)
        self._clock.mark_completion(index, self._works[index])
        self._next = index + 1

    def _reset_marks(self) -> None:
        self._marked.clear()
        self._missing = [len(b.names) for b in self.buckets]
        self._works = [None] * len(self.buckets)
        self._launched_at = [0.0] * len(self.buckets)
        self._next = 0

    def finish(self) -> None:
        """Start the reductions not yet started and wait for all of them.

        Afterwards ``grads`` hold the mean over ranks (the weighted sum with ``weight`` set).
        A second call with no ``zero_grad``/``mark_ready`` in between does nothing; inside
        ``no_sync()`` it only ends the micro-step.
        """
        if not self._sync:
            self._reset_marks()
            return
        if not self._open:
            return
        while self._next < len(self.buckets):
            self._launch(self._next, self._weight)
        self._wait_all()
        self._reset_marks()
        self._open = False

    def _wait_all(self) -> None:
        t0 = time.perf_counter()
        for index, work in enumerate(self._works):
            work.wait()
            if (index, "end") not in self._clock.marks:  # no completion event to go by
                self._clock.mark(index, "end")
            bucket = self.buckets[index]
            timeline_span(
                "ddp buckets",
                f"bucket {index}",
                self._launched_at[index],
                time.monotonic(),
                bytes=bucket.nbytes,
                dtype=str(bucket.dtype),
            )
        waited = time.perf_counter() - t0
        self._stats.wait_s = waited
        self._stats.total_wait_s += waited
        self._stats.steps += 1

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Accumulate gradients locally: nothing is communicated inside.

        Example:
            >>> ddp = DistributedDataParallel(params, comm)
            >>> def backward(micro_batch):                  # adds its gradients
            ...     for g in ddp.grads.values():
            ...         g += micro_batch
            >>> ddp.zero_grad()
            >>> with ddp.no_sync():
            ...     backward(1.0); ddp.finish()   # records only
            >>> backward(2.0); ddp.finish()       # reduces the sum of both
            >>> ddp.grads["b"]
            array([3., 3., 3.], dtype=float32)
        """
        if self._next > 0:
            raise InvalidArgumentError(
                "no_sync: reductions of this step already started; call finish() first"
            )
        previous, self._sync = self._sync, False
        try:
            yield
        finally:
            self._sync = previous
            self._reset_marks()

    # -- trainers with their own arrays -----------------------------------------------------

    def sync_gradients(self, grads: Mapping[str, Any], weight: float | None = None) -> None:
        """Average ``grads`` (name -> array, the model's names and shapes) over ranks in place.

        Each bucket is packed into its flat buffer (one fused copy per bucket on GPU), reduced
        through the hook, and copied back. ``weight`` plays the role of ``ddp.weight`` for
        this call (default: ``ddp.weight``). Inside ``no_sync()`` it does nothing. The flat
        buffers are the staging area, so ``ddp.grads`` hold the result too.

        Example:
            >>> ddp = DistributedDataParallel(params, comm)
            >>> my_grads = {"w": np.full((2, 3), 2.0, np.float32), "b": np.ones(3, np.float32)}
            >>> ddp.sync_gradients(my_grads)      # my_grads now hold the mean over ranks
            >>> my_grads["b"]
            array([1., 1., 1.], dtype=float32)
        """
        call = "sync_gradients"
        if not self._sync:
            return
        if self._next > 0 or self._marked:
            raise InvalidArgumentError(
                f"{call}: a mark_ready step is in progress; call finish() first"
            )
        weight = self._weight if weight is None else self._checked_weight(weight, call)
        arrays = self._checked_grads(grads, call)
        for bucket, table in zip(self.buckets, self._tables):
            if self._converts(bucket, arrays):
                for name in bucket.names:
                    g = arrays[name]
                    bucket.views[name][...] = to_float32(g) if not hasattr(g, "dtype") else g
            else:
                pack(bucket, [arrays[n] for n in bucket.names], table)
            self._launch(bucket.index, weight)
        self._wait_all()
        for bucket, table in zip(self.buckets, self._tables):
            if self._converts(bucket, arrays):
                for name in bucket.names:
                    round_into(arrays[name], bucket.views[name])
            else:
                unpack(bucket, [arrays[n] for n in bucket.names], table)
        self._reset_marks()
        self._open = False

    def _checked_grads(self, grads: Mapping[str, Any], call: str) -> dict[str, Any]:
        if not isinstance(grads, Mapping):
            raise InvalidArgumentError(
                f"{call}: grads must be a mapping name -> array, got {type(grads).__name__}"
            )
        missing = [n for n in self.params if n not in grads]
        extra = [n for n in grads if n not in self.params]
        if missing or extra:
            raise InvalidArgumentError(
                f"{call}: grads must have the parameters' names; missing {missing}, unknown {extra}"
            )
        out = {}
        for name, p in self.params.items():
            g = to_array(grads[name], call, f"grads[{name!r}]")
            if tuple(g.shape) != tuple(p.shape) or dtype_label(g) != dtype_label(p):
                raise InvalidArgumentError(
                    f"{call}: grads[{name!r}] has shape {tuple(g.shape)} dtype {dtype_label(g)}, "
                    f"expected {tuple(p.shape)} {dtype_label(p)}"
                )
            if array_module(g) is not self._xp:
                raise InvalidArgumentError(
                    f"{call}: grads[{name!r}] is not a {self._xp.__name__} array like params"
                )
            out[name] = g
        return out

    @staticmethod
    def _converts(bucket: Bucket, arrays: Mapping[str, Any]) -> bool:
        """Whether the bucket's dtype differs from its gradients' (reduce_dtype)."""
        return any(dtype_label(arrays[n]) != str(bucket.dtype) for n in bucket.names)

    # -- non-parameter state ----------------------------------------------------------------

    def broadcast_buffers(self, buffers: Any, root: int = 0) -> None:
        """Broadcast non-parameter state (running statistics...) from ``root``, in place.

        ``buffers`` is a mapping name -> array or a sequence of arrays.

        Example:
            >>> ddp = DistributedDataParallel(params, comm)
            >>> mean, var = np.zeros(3, np.float32), np.ones(3, np.float32)
            >>> ddp.broadcast_buffers({"bn.mean": mean, "bn.var": var})   # rank 0's, in place
        """
        call = "broadcast_buffers"
        if not (int(root) == root and 0 <= root < self.comm.size):
            raise InvalidArgumentError(f"{call}: root must be in [0, {self.comm.size}), got {root}")
        arrays = list(buffers.values()) if isinstance(buffers, Mapping) else list(buffers)
        works = [self.comm.broadcast(a, root=int(root), async_op=True) for a in arrays]
        for work in works:
            work.wait()

    def __repr__(self) -> str:
        total = sum(b.nbytes for b in self.buckets)
        return (
            f"DistributedDataParallel({len(self.params)} params, {len(self.buckets)} buckets, "
            f"{total} bytes, rank {self.comm.rank} of {self.comm.size})"
        )

    # -- checkpoint state (ddp.checkpoint)

    def state_dict(self, placements: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The parameters by name (replicated over ``comm``: each written once), placed in
        their global tensors by ``placements`` (name -> ``(global_shape, offsets)``) where
        they are tensor-parallel blocks. A load fills them in place.

        Example: ``checkpoint.save("ckpt", {"model": {"params": ddp}}, comm, step=3)``.
        """
        return {name: placed(p, name, placements) for name, p in self.params.items()}
