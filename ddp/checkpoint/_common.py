"""What save and load share: the small JSON exchange between ranks, host copies, paths."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

from collectives import CommunicatorLike

STEP_DIR = re.compile(r"^step-(\d+)$")
TEMP_PREFIX = ".tmp-"


class _Alone:
    """A world of one rank, for ``comm=None``."""

    rank, size = 0, 1


def world(comm: CommunicatorLike | None) -> Any:
    return _Alone() if comm is None else comm


def exchange(comm: CommunicatorLike | None, obj: Any) -> list[Any]:
    """Every rank's JSON value ``obj``, in rank order, on every rank (two all-gathers).

    Travels as bytes in the communicator's own arrays (an NCCL communicator takes no host
    arrays), under the communicator's timeout like any other call.
    """
    data = json.dumps(obj, separators=(",", ":")).encode()
    if comm is None or comm.size == 1:
        return [json.loads(data)]
    xp = comm.xp
    lengths = _host(comm.all_gather(xp.asarray([len(data)], dtype=xp.int64))).ravel()
    longest = int(lengths.max())
    mine = np.zeros(longest, dtype=np.uint8)
    mine[: len(data)] = np.frombuffer(data, dtype=np.uint8)
    every = _host(comm.all_gather(xp.asarray(mine)))
    return [json.loads(every[r, : int(n)].tobytes()) for r, n in enumerate(lengths)]


def _host(x: Any) -> np.ndarray:
    return x.get() if hasattr(x, "get") and not isinstance(x, np.ndarray) else np.asarray(x)


def to_host(x: Any, copy: bool) -> np.ndarray:
    """``x`` as a NumPy array in host memory (a copy when ``copy`` or when on a GPU)."""
    if hasattr(x, "get") and not isinstance(x, np.ndarray):
        return x.get()
    return np.array(x, copy=True) if copy else np.asarray(x)


def step_dir(directory: Path, step: int) -> Path:
    return directory / f"step-{step:08d}"
