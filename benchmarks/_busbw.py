"""Element counts and bandwidths per collective, exactly as nccl-tests computes them.

nccl-tests turns a message size into a per-call ``count`` (``setupArgs`` and each test's
``GetCollByteCount``), times the call, then reports ``algbw = bytes / time`` and
``busbw = algbw * factor``, where ``factor`` is what makes busbw comparable with the
hardware's link bandwidth whatever the collective (see nccl-tests' doc/PERFORMANCE.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from collectives import InvalidArgumentError

#: every collective the benchmark runs, in the order the README lists them
OPS = (
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "gather",
    "scatter",
    "sendrecv",
    "hypercube",
)
#: collectives that take a reduce op (the others print ``none`` in the redop column)
REDUCING = frozenset({"all_reduce", "reduce", "reduce_scatter"})
#: collectives that take a root (the others print ``-1`` in the root column)
ROOTED = frozenset({"reduce", "broadcast", "gather", "scatter"})

#: nccl-tests' hypercube_perf: an all_gather made of send/recv pairs over the dimensions of
#: a hypercube (power-of-two worlds only); the raw libraries have no such call
HYPERCUBE = "hypercube"
# count per rank, and the message is count * size: gathered, scattered or exchanged
_PER_RANK = frozenset({"all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"})
# the buffer each rank receives into is size times its send buffer (and the reverse)
_RECV_TIMES_SIZE = frozenset({"all_gather", "gather", "all_to_all", HYPERCUBE})
_SEND_TIMES_SIZE = frozenset({"reduce_scatter", "scatter", "all_to_all"})


def _check_op(op: str, call: str) -> None:
    if op not in OPS:
        raise InvalidArgumentError(f"{call}: op must be one of {', '.join(OPS)}, got {op!r}")


@dataclass(frozen=True)
class Counts:
    """Element counts of one benchmark row (nccl-tests' paramcount, sendcount, recvcount)."""

    count: int  # the ``count`` column: what the call is given
    send: int  # elements in each rank's send buffer
    recv: int  # elements in each rank's receive buffer


def counts(op: str, nbytes: int, itemsize: int, size: int) -> Counts:
    """Element counts for a message of ``nbytes`` on ``size`` ranks.

    Example:
        >>> counts("all_gather", 1024, 4, 4)  # 256 floats in all, 64 from each rank
        Counts(count=64, send=64, recv=256)
        >>> counts("all_gather", 240, 4, 3)  # 20 floats per rank, trimmed to 16 (4 blocks)
        Counts(count=16, send=16, recv=48)
    """
    _check_op(op, "counts")
    total = nbytes // itemsize
    if op not in _PER_RANK and op != HYPERCUBE:
        return Counts(total, total, total)
    # whole 16-byte blocks per rank, as nccl-tests' GetCollByteCount of each of these
    per_rank = (total // size) & ~(max(16 // itemsize, 1) - 1)
    if op == HYPERCUBE:
        return Counts(per_rank, per_rank, per_rank * size)
    return Counts(
        per_rank,
        per_rank * size if op in _SEND_TIMES_SIZE else per_rank,
        per_rank * size if op in _RECV_TIMES_SIZE else per_rank,
    )


def row_bytes(c: Counts, itemsize: int) -> int:
    """The ``size`` column: the larger of the send and receive buffers, in bytes."""
    return max(c.send, c.recv) * itemsize


def algbw_bytes(op: str, count: int, itemsize: int, size: int) -> int:
    """The bytes algbw divides by time: ``count * itemsize``, times ``size`` for per-rank ops.

    Example:
        >>> algbw_bytes("all_reduce", 256, 4, 4), algbw_bytes("all_gather", 64, 4, 4)
        (1024, 1024)
    """
    _check_op(op, "algbw_bytes")
    if op == HYPERCUBE:  # the blocks each rank receives
        return count * itemsize * (size - 1)
    return count * itemsize * (size if op in _PER_RANK else 1)


def bus_factor(op: str, size: int) -> float:
    """busbw / algbw: ``2(n-1)/n`` for all_reduce, ``(n-1)/n`` for the gathers and
    scatters, 1 for broadcast, reduce and sendrecv.

    Example:
        >>> bus_factor("all_reduce", 4), bus_factor("all_gather", 4), bus_factor("reduce", 4)
        (1.5, 0.75, 1.0)
    """
    _check_op(op, "bus_factor")
    if size < 1:
        raise InvalidArgumentError(f"bus_factor: size must be >= 1, got {size}")
    if op == "all_reduce":
        return 2.0 * (size - 1) / size
    if op in _PER_RANK:
        return (size - 1) / size
    return 1.0


def bandwidths(
    op: str, count: int, itemsize: int, size: int, seconds: float
) -> tuple[float, float]:
    """(algbw, busbw) in GB/s (1e9 bytes per second) for one call taking ``seconds``.

    Example:
        >>> bandwidths("all_reduce", 250_000_000, 4, 2, 1.0)
        (1.0, 1.0)
    """
    if seconds <= 0:
        return 0.0, 0.0
    algbw = algbw_bytes(op, count, itemsize, size) / 1e9 / seconds
    return algbw, algbw * bus_factor(op, size)
