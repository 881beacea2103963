"""Check mode: before each call, every rank verifies that all ranks make the same call.

One small non-blocking all-reduce of ``(fingerprint, -fingerprint)`` with MAX gives the
largest and smallest fingerprint at once; only when they differ do the ranks exchange their
descriptions, so that every rank can raise the same error naming who differs and how.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np
from mpi4py import MPI

from ._errors import CollectiveMismatchError
from ._mpi import MpiPending

#: calls between two ranks only: there is nothing to compare across the whole communicator
POINT_TO_POINT = frozenset({"send", "recv"})


def describe_call(seq: int, call: str, shape: Any, dtype: Any, root: Any, op: Any) -> dict:
    """The fields every rank must agree on for one call (point-to-point calls excluded)."""
    return {
        "seq": seq,
        "call": call,
        "shape": shape,
        "dtype": dtype,
        "root": root,
        "op": None if op is None else str(op),
    }


def fingerprint(fields: dict) -> int:
    """A stable 32-bit hash of the fields (crc32: the same in every process, unlike hash())."""
    text = "|".join(f"{k}={fields[k]}" for k in sorted(fields))
    return zlib.crc32(text.encode())


def mismatch_message(descriptions: list[dict]) -> str:
    """Which fields differ and each rank's value, e.g. ``shape differs: rank 0 (4,), rank 1 (5,)``."""
    keys = [k for k in descriptions[0] if len({repr(d[k]) for d in descriptions}) > 1]
    lines = []
    for key in keys:
        values = ", ".join(f"rank {r}: {d[key]}" for r, d in enumerate(descriptions))
        lines.append(f"{key} differs ({values})")
    first = descriptions[0]
    return (
        f"ranks called different collectives at call #{first['seq']} of rank 0 "
        f"({first['call']}): " + "; ".join(lines)
    )


class Checker:
    """The per-communicator state of check mode: a private MPI communicator to compare on."""

    def __init__(self, comm: Any):
        self.comm = comm
        self.mpi = comm.mpi_comm.Dup()
        self.rank = comm.rank
        self.buffer = np.zeros(2, np.int64)

    def verify(self, seq: int, call: str, array: Any, name: Any, op: Any, root: Any) -> None:
        if call in POINT_TO_POINT:
            return
        shape = None if array is None else tuple(array.shape)
        if call == "scatter" and root == self.rank and shape is not None:
            shape = shape[1:]  # root holds the whole (size, *shape) array
        fields = describe_call(seq, call, shape, name, root, op)
        fp = fingerprint(fields)
        buffer = self.buffer
        buffer[0], buffer[1] = fp, -fp
        pending = MpiPending([self.mpi.Iallreduce(MPI.IN_PLACE, [buffer, MPI.INT64_T], MPI.MAX)])
        pending.seq, pending.call = seq, f"check of {call}"
        pending.synchronize(self.comm)
        if buffer[0] == -buffer[1]:
            return
        descriptions = self.mpi.allgather(fields)
        raise CollectiveMismatchError(f"{call}: {mismatch_message(descriptions)}")

    def close(self) -> None:
        if self.mpi != MPI.COMM_NULL:
            self.mpi.Free()
