"""What a run leaves behind: JSON rows with the run's metadata, and a busbw-vs-size plot."""

from __future__ import annotations

import datetime
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import socket
import sys
from pathlib import Path
from typing import Any

from ._table import PLACEMENTS


def _version(module: str) -> str | None:
    """The module's version if it is installed, without importing it when it is not loaded."""
    if module in sys.modules or importlib.util.find_spec(module) is not None:
        try:
            version = getattr(importlib.import_module(module), "__version__", None)
            return str(version) if version else importlib.metadata.version(module)
        except Exception:  # a broken optional install must not spoil the report
            return None
    return None


def library_versions(backend: str) -> dict[str, Any]:
    """Python, NumPy, mpi4py and the MPI library; CuPy, NCCL and torch where they are loaded."""
    from mpi4py import MPI

    versions: dict[str, Any] = {
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "mpi4py": _version("mpi4py"),
        "mpi": " ".join(MPI.Get_library_version().split("\n")[0].split()),
        "collectives": _version("collectives"),
    }
    for module in ("cupy", "torch"):
        if module in sys.modules:
            versions[module] = _version(module)
    if backend == "nccl" or "cupy" in sys.modules:
        try:
            from cupy.cuda import nccl

            versions["nccl"] = nccl.get_version()
        except Exception:
            versions["nccl"] = None
    return versions


def metadata(comm: Any, args: Any, argv: list[str]) -> dict[str, Any]:
    """Everything needed to tell two runs apart: who, where, when, with what."""
    hosts = comm.mpi_comm.allgather(socket.gethostname())
    meta = {
        "benchmark": "collective",
        "op": args.op,
        "backend": comm.backend,
        "world_size": comm.size,
        "host": hosts[0],
        "hosts": sorted(set(hosts)),
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "command": " ".join([args.prog, *argv]),
        "platform": platform.platform(),
        "cpu_count": _cpu_count(),
        "versions": library_versions(comm.backend),
        "dtype": args.dtype,
        "redop": args.redop,
        "root": args.root,
        "iters": args.iters,
        "warmup_iters": args.warmup_iters,
        "rounds": args.rounds,
        "stat": args.stat,
        "check": bool(args.check),
        "baseline": args.baseline,
        "async": args.async_op,
    }
    if comm.backend == "nccl":
        meta["device"] = _device_name()
    return meta


def _cpu_count() -> int | None:
    return os.cpu_count()


def _device_name() -> str | None:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)["name"].decode()
    except Exception:
        return None


def write_json(
    path: str | Path, meta: dict[str, Any], rows: list[dict], totals: dict, complete: bool = True
) -> None:
    """``{"metadata": ..., "rows": [...], "summary": ..., "complete": ...}``, indented, to
    ``path``, atomically: called after every row (``complete`` False until the last), so
    that a run stopped mid-sweep leaves every row it measured in a whole file.

    Example:
        >>> write_json("out.json", {"op": "all_reduce"}, [], {"wrong": 0}, complete=False)
    """
    text = json.dumps(
        {"metadata": meta, "rows": rows, "summary": totals, "complete": complete}, indent=1
    )
    atomic_write(path, text + "\n")


def atomic_write(path: str | Path, text: str) -> None:
    """Replace ``path`` by ``text`` at once: readers (and a run killed mid-write) see the
    old file or the new one, never half of one.

    Example:
        >>> atomic_write("out.json", "{}")
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def plot(path: str | Path, meta: dict[str, Any], rows: list[dict]) -> None:
    """Bus bandwidth against message size (log x), ours and the baseline's, to a PNG."""
    import matplotlib

    matplotlib.use("Agg")  # no display on cluster nodes
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    names = [("ours", lambda row: row)]
    if meta.get("baseline"):
        names.append((meta["baseline"], lambda row: row.get("baseline") or {}))
    for name, pick in names:
        for placement, style in zip(PLACEMENTS, ("-o", "--s")):
            points = [(row["size"], pick(row).get(placement)) for row in rows]
            points = [(size, cell["busbw"]) for size, cell in points if cell]
            if points:
                sizes, busbw = zip(*points)
                label = f"{name} {placement.replace('_', '-')}"
                ax.plot(sizes, busbw, style, markersize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(
        f"{meta['op']} {meta['dtype']}, {meta['backend']} backend, "
        f"{meta['world_size']} ranks on {meta['host']}"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
