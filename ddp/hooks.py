"""Communication hooks: how one bucket's flat buffer becomes the mean over ranks.

A hook is ``hook(comm, bucket) -> work``: it starts the reduction of ``bucket.buffer`` and
returns an object with ``wait()`` (after which ``bucket.buffer`` holds the mean gradient),
``is_completed()`` and ``synchronize()``: a collectives ``Work`` or a :class:`HookWork`.
Stateless hooks are plain functions; hooks with state (PowerSGD, Int8Quantize) are small
objects whose state is keyed by ``bucket.index``.

Example:
    >>> from ddp import DistributedDataParallel, hooks
    >>> ddp = DistributedDataParallel(params, comm, hook=hooks.PowerSGD(rank=2))
"""

from __future__ import annotations

import math
from typing import Any, Callable, NamedTuple

import numpy as np

import collectives as col
from collectives import (
    CommunicatorLike,
    InvalidArgumentError,
    array_module,
    bfloat16_to_float32,
    float32_to_bfloat16,
)

__all__ = [
    "HookWork",
    "allreduce",
    "fp16_compress",
    "bf16_compress",
    "fp16_compress_wrapper",
    "bf16_compress_wrapper",
    "PowerSGD",
    "Int8Quantize",
]


class HookWork:
    """A Work-like handle: waits for collectives, then runs a finishing step.

    ``then`` runs once, inside ``wait()``. When it issues collectives of its own
    (``then_communicates=True``, as in PowerSGD's second round) it must run at the same
    point on every rank, so ``is_completed()`` never triggers it: it stays False until
    ``wait()`` has run.
    """

    def __init__(
        self,
        works: list[Any],
        then: Callable[[], None] | None = None,
        *,
        then_communicates: bool = False,
        device_array: Any = None,
    ):
        self._works = works
        self._then = then
        self._then_communicates = then_communicates
        self._device_array = device_array
        self._done = False

    def wait(self) -> None:
        """Wait for the collectives and run the finishing step (once)."""
        if self._done:
            return
        for work in self._works:
            work.wait()
        if self._then is not None:
            then, self._then = self._then, None
            then()
        self._done = True

    def is_completed(self) -> bool:
        """True once ``wait()`` would not block; never starts communication."""
        if self._done:
            return True
        if self._then_communicates or not all(w.is_completed() for w in self._works):
            return False
        self.wait()
        return True

    @property
    def event(self) -> Any:
        """The CUDA event the last collective completes with (NCCL), or None."""
        return getattr(self._works[-1], "event", None) if self._works else None

    def synchronize(self) -> None:
        """Block the host until the result is in place."""
        self.wait()
        if self._device_array is not None and array_module(self._device_array) is not np:
            array_module(self._device_array).cuda.get_current_stream().synchronize()


def allreduce(comm: CommunicatorLike, bucket: Any) -> Any:
    """The default hook: all-reduce the bucket to its mean (``op="avg"``, which no backend
    lets overflow in half precision where the mean fits).

    Example:
        >>> from ddp import DistributedDataParallel, hooks
        >>> ddp = DistributedDataParallel(params, comm, hook=hooks.allreduce)
    """
    return comm.all_reduce(bucket.buffer, op="avg", async_op=True)


class _Wire(NamedTuple):
    """How a compression wrapper's values travel."""

    short: str  # names the wrapped hook: fp16_compress_wrapper(PowerSGD)
    dtype: str  # data already of this dtype travels as it is
    encode: Callable[[Any], tuple[Any, Any]]  # float values -> (what to send, its storage)
    decode: Callable[[Any], Any]  # the storage, reduced -> float values


def _to_float16(values: Any) -> tuple[Any, Any]:
    packed = values.astype(np.float16)
    return packed, packed


def _to_bfloat16(values: Any) -> tuple[Any, Any]:
    packed = float32_to_bfloat16(values.astype(np.float32, copy=False))
    return col.as_bfloat16(packed), packed


_FLOAT16 = _Wire("fp16", "float16", _to_float16, lambda packed: packed)
_BFLOAT16 = _Wire("bf16", "bfloat16", _to_bfloat16, bfloat16_to_float32)


class _CompressingComm:
    """The communicator a wrapped hook sees: its floating sum and avg all-reduces travel as
    ``wire`` and are cast back into the result; every other call goes to ``comm`` unchanged.

    An avg is divided by the world size before the cast, then summed: a value past half
    precision's range whose mean is within it still travels (the cast would overflow first).
    """

    def __init__(self, comm: CommunicatorLike, wire: _Wire):
        self._comm = comm
        self._wire = wire

    def __getattr__(self, name: str) -> Any:
        return getattr(self._comm, name)

    def all_reduce(
        self, x: Any, op: Any = "sum", *, out: Any = None, async_op: bool = False
    ) -> Any:
        kind = str(op).lower()
        dtype = getattr(x, "dtype", None)
        wire = self._wire
        if (
            kind not in ("sum", "avg")
            or dtype is None
            or dtype.kind != "f"
            or dtype.name == wire.dtype
        ):
            return self._comm.all_reduce(x, op, out=out, async_op=async_op)
        result = x if out is None else out
        send, packed = wire.encode(x * dtype.type(1.0 / self._comm.size) if kind == "avg" else x)

        def decode() -> None:
            result[...] = wire.decode(packed)

        work = self._comm.all_reduce(send, op="sum", async_op=async_op)
        if not async_op:
            decode()
            return result
        return HookWork([work], decode, device_array=result)


def _compress_wrapper(hook: Any, wire: _Wire) -> Callable[[Any, Any], Any]:
    def compressed(comm: CommunicatorLike, bucket: Any) -> Any:
        return hook(_CompressingComm(comm, wire), bucket)

    inner = getattr(hook, "__name__", type(hook).__name__)
    compressed.__name__ = compressed.__qualname__ = f"{wire.short}_compress_wrapper({inner})"
    return compressed


def fp16_compress_wrapper(hook: Any) -> Callable[[Any, Any], Any]:
    """``hook`` with its floating all-reduces sent as float16 (half the bytes of float32).

    The wrapped hook computes as before; each sum or avg all-reduce it issues on float32 or
    float64 data is divided by the world size (avg), cast to float16, summed and cast back.

    Example:
        >>> from ddp import DistributedDataParallel, hooks
        >>> hook = hooks.fp16_compress_wrapper(hooks.PowerSGD(rank=4))
        >>> ddp = DistributedDataParallel(params, comm, hook=hook)
    """
    return _compress_wrapper(hook, _FLOAT16)


def bf16_compress_wrapper(hook: Any) -> Callable[[Any, Any], Any]:
    """``hook`` with its floating all-reduces sent as bfloat16 (float32's range, 8 bits of
    mantissa), rounded to nearest even.

    NumPy and CuPy have no bfloat16 dtype: the values travel as uint16 bit patterns declared
    with ``collectives.as_bfloat16`` (NCCL reduces them natively; the MPI backend in float32).

    Example:
        >>> from ddp import hooks
        >>> hook = hooks.bf16_compress_wrapper(hooks.allreduce)   # = hooks.bf16_compress
    """
    return _compress_wrapper(hook, _BFLOAT16)


#: the all-reduce hook sent as float16: ``fp16_compress_wrapper(allreduce)``
fp16_compress = fp16_compress_wrapper(allreduce)
#: the all-reduce hook sent as bfloat16: ``bf16_compress_wrapper(allreduce)``
bf16_compress = bf16_compress_wrapper(allreduce)


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


class PowerSGD:
    """Low-rank gradient compression (Vogels et al., 2019) with error feedback.

    Every matrix-shaped gradient M (n x m, higher ranks flattened to (shape[0], -1)) is sent
    as two thin factors: P = M Q (n x r), averaged and orthonormalized, then Q = M^T P
    (m x r), averaged; the mean is approximated by P Q^T and what the approximation missed
    is added to the next step's gradient. Vectors, and matrices too small to gain at least
    ``min_compression_rate``, are averaged exactly. The first ``start_iter`` reductions of
    each bucket are exact all-reduces (compression hurts most early in training).

    Args:
        rank: the rank r of the approximation.
        start_iter: reductions per bucket done exactly before compression starts.
        min_compression_rate: compress a matrix only if n*m >= rate * r*(n + m).
        seed: seed of the initial Q (the same on every rank).

    Example:
        >>> from ddp import DistributedDataParallel, hooks
        >>> ddp = DistributedDataParallel(params, comm, hook=hooks.PowerSGD(rank=4, start_iter=10))
    """

    def __init__(
        self,
        rank: int = 1,
        start_iter: int = 10,
        *,
        min_compression_rate: float = 2.0,
        seed: int = 0,
    ):
        if int(rank) != rank or rank < 1:
            raise InvalidArgumentError(f"PowerSGD: rank must be an integer >= 1, got {rank}")
        if int(start_iter) != start_iter or start_iter < 0:
            raise InvalidArgumentError(
                f"PowerSGD: start_iter must be an integer >= 0, got {start_iter}"
            )
        self.rank = int(rank)
        self.start_iter = int(start_iter)
        self.min_compression_rate = float(min_compression_rate)
        self.seed = int(seed)
        self._iter: dict[int, int] = {}
        self._error: dict[int, Any] = {}
        self._q: dict[int, list[Any]] = {}

    def _matrices(self, bucket: Any) -> list[tuple[str, int, int, int]]:
        """(name, n, m, r) of the gradients worth compressing, in bucket order."""
        out = []
        for name, shape in zip(bucket.names, bucket.shapes):
            if len(shape) < 2:
                continue
            n, m = shape[0], math.prod(shape[1:])
            r = min(self.rank, n, m)
            if n * m >= self.min_compression_rate * r * (n + m):
                out.append((name, n, m, r))
        return out

    def __call__(self, comm: CommunicatorLike, bucket: Any) -> Any:
        step = self._iter.get(bucket.index, 0)
        self._iter[bucket.index] = step + 1
        matrices = self._matrices(bucket)
        if step < self.start_iter or not matrices:
            return allreduce(comm, bucket)

        xp = array_module(bucket.buffer)
        dtype = _compute_dtype(bucket.dtype)
        compressed = {name for name, _, _, _ in matrices}
        plain = [bucket.views[n] for n in bucket.names if n not in compressed]

        mats = []
        for name, n, m, _ in matrices:
            mats.append(bucket.views[name].reshape(n, m).astype(dtype, copy=False))
        if bucket.index not in self._error:
            self._error[bucket.index] = [xp.zeros((n, m), dtype) for _, n, m, _ in matrices]
            rng = np.random.default_rng([self.seed, bucket.index])
            self._q[bucket.index] = [
                xp.asarray(rng.standard_normal((m, r)).astype(dtype)) for _, _, m, r in matrices
            ]
        errors, qs = self._error[bucket.index], self._q[bucket.index]
        for mat, err in zip(mats, errors):
            mat += err  # error feedback: send what earlier steps failed to send

        works = []
        plain_flat = None
        if plain:
            plain_flat = xp.concatenate([v.ravel() for v in plain]).astype(dtype, copy=False)
            works.append(comm.all_reduce(plain_flat, op="avg", async_op=True))
        p_flat = xp.empty(sum(n * r for _, n, _, r in matrices), dtype)
        p_views, off = [], 0
        for (_, n, _, r), mat, q in zip(matrices, mats, qs):
            p = p_flat[off : off + n * r].reshape(n, r)
            xp.matmul(mat, q, out=p)
            p_views.append(p)
            off += n * r
        p_work = comm.all_reduce(p_flat, op="avg", async_op=True)

        def second_round() -> None:
            p_work.wait()
            q_flat = xp.empty(sum(m * r for _, _, m, r in matrices), dtype)
            q_views, off = [], 0
            for (_, _, m, r), mat, p in zip(matrices, mats, p_views):
                p[...] = xp.linalg.qr(p)[0]
                q = q_flat[off : off + m * r].reshape(m, r)
                xp.matmul(mat.T, p, out=q)
                q_views.append(q)
                off += m * r
            comm.all_reduce(q_flat, op="avg")
            for i, (name, n, m, _) in enumerate(matrices):
                approx = p_views[i] @ q_views[i].T
                errors[i][...] = mats[i] - approx
                qs[i][...] = q_views[i]  # warm start: next step begins from this Q
                bucket.views[name].reshape(n, m)[...] = approx
            for w in works:
                w.wait()
            if plain_flat is not None:
                off = 0
                for v in plain:
                    v.ravel()[...] = plain_flat[off : off + v.size]
                    off += v.size

        return HookWork([], second_round, then_communicates=True, device_array=bucket.buffer)


class Int8Quantize:
    """8-bit gradients with one float32 scale per chunk, and error feedback.

    Two rounds, each moving int8 data: an all-to-all gives every rank one segment of every
    rank's quantized buffer, which it dequantizes, averages and quantizes again; an
    all-gather returns the averaged segments to everyone. Each rank keeps what its
    quantizations dropped (its whole buffer for the first round, its segment for the second)
    and adds it back the next step, so the error does not accumulate.

    Args:
        chunk_size: elements that share one scale (absmax / 127).

    Example:
        >>> from ddp import DistributedDataParallel, hooks
        >>> ddp = DistributedDataParallel(params, comm, hook=hooks.Int8Quantize())
    """

    def __init__(self, chunk_size: int = 1024):
        if int(chunk_size) != chunk_size or chunk_size < 1:
            raise InvalidArgumentError(
                f"Int8Quantize: chunk_size must be an integer >= 1, got {chunk_size}"
            )
        self.chunk_size = int(chunk_size)
        self._error: dict[int, Any] = {}
        self._server_error: dict[int, Any] = {}

    def _quantize(self, x: Any) -> tuple[Any, Any, Any]:
        """(int8 values, float32 scales, dequantized values) of a float32 x, chunk by chunk."""
        xp = array_module(x)
        chunks = x.reshape(-1, self.chunk_size)
        scales = xp.abs(chunks).max(axis=1) / np.float32(127.0)
        safe = xp.where(scales > 0, scales, np.float32(1.0))
        q = xp.clip(xp.rint(chunks / safe[:, None]), -127, 127).astype(np.int8)
        return q, scales.astype(np.float32), (q * scales[:, None]).reshape(x.shape)

    def __call__(self, comm: CommunicatorLike, bucket: Any) -> Any:
        xp = array_module(bucket.buffer)
        size, n = comm.size, bucket.numel
        block = size * self.chunk_size
        total = -(-n // block) * block
        seg = total // size
        x = xp.zeros(total, np.float32)
        x[:n] = bucket.buffer
        if bucket.index in self._error:
            x[:n] += self._error[bucket.index]
        q, scales, approx = self._quantize(x)
        self._error[bucket.index] = (x - approx)[:n]
        q_recv = xp.empty((size, seg), np.int8)
        s_recv = xp.empty((size, seg // self.chunk_size), np.float32)
        works = [
            comm.all_to_all(q.reshape(size, seg), out=q_recv, async_op=True),
            comm.all_to_all(scales.reshape(size, -1), out=s_recv, async_op=True),
        ]

        def second_round() -> None:
            for w in works:
                w.wait()
            parts = q_recv.reshape(size, -1, self.chunk_size) * s_recv[:, :, None]
            mean = parts.sum(axis=0).reshape(seg) / np.float32(size)
            if bucket.index in self._server_error:
                mean += self._server_error[bucket.index]
            q2, s2, approx2 = self._quantize(mean)
            self._server_error[bucket.index] = mean - approx2
            q_all = xp.empty((size, seg), np.int8)
            s_all = xp.empty((size, s2.size), np.float32)
            comm.all_gather(q2.reshape(seg), out=q_all)
            comm.all_gather(s2, out=s_all)
            result = q_all.reshape(size, -1, self.chunk_size) * s_all[:, :, None]
            bucket.buffer[...] = result.reshape(total)[:n]

        return HookWork([], second_round, then_communicates=True, device_array=bucket.buffer)
