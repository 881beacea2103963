"""Small host-side exchanges (a few numbers per rank) through the communicator's own verbs.

They go through the collectives layer rather than raw mpi4py so that the communicator's
timeout applies; on NCCL the numbers travel in a tiny device array.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from collectives import CommunicatorLike


def reduce_scalars(comm: CommunicatorLike, values: Sequence[float], op: str) -> list[float]:
    """All-reduce a few float64 numbers with ``op``; every rank gets the same list."""
    xp = comm.xp
    buf = xp.asarray(np.asarray(values, dtype=np.float64))
    comm.all_reduce(buf, op=op)
    return [float(v) for v in _host(buf)]


def gather_scalars(comm: CommunicatorLike, values: Sequence[float]) -> np.ndarray:
    """All-gather a few float64 numbers: row r of the (size, len(values)) result is rank r's."""
    xp = comm.xp
    buf = xp.asarray(np.asarray(values, dtype=np.float64))
    out = xp.empty((comm.size, buf.size), dtype=np.float64)
    comm.all_gather(buf, out=out)
    return _host(out)


def _host(x: Any) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.get()
