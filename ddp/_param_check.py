"""The check that every rank holds the same parameters: names, shapes, dtypes and order.

Shared by ``DistributedDataParallel`` and ``tune_bucket_cap``, which both run it before
their first collective on the parameters.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

from collectives import CollectiveMismatchError, CommunicatorLike

from ._precision import dtype_label
from ._scalars import reduce_scalars


def check_params_agree(comm: CommunicatorLike, params: Mapping[str, Any], call: str) -> None:
    """Every rank must hold the same names, shapes and dtypes, in the same order."""
    mine = [(name, tuple(p.shape), dtype_label(p)) for name, p in params.items()]
    fingerprint = float(zlib.crc32(repr(mine).encode()))
    high, low = reduce_scalars(comm, [fingerprint, -fingerprint], "max")
    if high == fingerprint and -low == fingerprint:
        return
    # metadata only (never arrays): pickling mpi4py calls are fine here
    every = comm.mpi_comm.allgather(mine)
    for i in range(max(len(e) for e in every)):
        column = [e[i] if i < len(e) else None for e in every]
        if len(set(column)) > 1:
            break
    groups: dict[Any, list[int]] = {}
    for rank, entry in enumerate(column):
        groups.setdefault(entry, []).append(rank)
    parts = []
    for entry, ranks in groups.items():
        who = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks}"
        if entry is None:
            parts.append(f"{who}: no parameter")
        else:
            name, shape, dtype = entry
            parts.append(f"{who}: {name!r} shape {shape} dtype {dtype}")
    raise CollectiveMismatchError(
        f"{call}: params differ across ranks at parameter {i}: " + "; ".join(parts)
    )
