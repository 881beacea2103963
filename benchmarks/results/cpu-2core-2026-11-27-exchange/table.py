"""The tables in benchmarks/README.md ("Two ranks' reduce_scatter as one exchange") from the
JSON of run.sh: python table.py

reduce_scatter, ours / mpi4py, 2 ranks, per MPI, mode and placement, the tree before
(MPI's own reduce_scatter) and this one (one exchange), over run.sh's three runs: the median
(range) of every size from 8 B to 1 KiB, then of 1 MiB, then the median per size of the
4 KiB-16 MiB sweep. Then every verb (run_every_verb.sh), before -> after: the median over
8 B-1 KiB, and 1 MiB.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
PLACEMENTS = (("out_of_place", "out of place"), ("in_place", "in place"))
MPIS = (("mpich", "MPICH"), ("openmpi", "Open MPI"), ("impi", "Intel MPI"))
TREES = (("before", "before"), ("main", "after"))
OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all",
       "gather", "scatter", "sendrecv")  # fmt: skip


def rows(mpi: str, tree: str, mode: str, sizes: str) -> list[dict]:
    """The rows of every run, one after the other."""
    paths = sorted(HERE.glob(f"{mpi}-np2/run*/{tree}/reduce_scatter-{mode}-{sizes}.json"))
    return [row for path in paths for row in json.loads(path.read_text())["rows"]]


def by_size(rows: list[dict], placement: str) -> dict[int, float]:
    """size -> the median ratio over the runs."""
    sizes = sorted({r["size"] for r in rows})
    return {
        s: statistics.median(r["ratio"][placement] for r in rows if r["size"] == s) for s in sizes
    }


def summary(values: list[float]) -> str:
    """median (min-max)"""
    low, high = min(values, default=0.0), max(values, default=0.0)
    return f"{statistics.median(values or [0.0]):.2f} ({low:.2f}-{high:.2f})"


def main() -> None:
    print("8 B-1 KiB, median (range) of the sizes; 1 MiB\n")
    titles = [f"{size}, {name}" for size in ("small", "1 MiB") for _, name in TREES]
    print("| MPI | mode | placement | " + " | ".join(titles) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in titles) + " |")
    for mpi, mpi_name in MPIS:
        for mode in ("sync", "async"):
            for placement, name in PLACEMENTS:
                cells = [
                    summary([r["ratio"][placement] for r in rows(mpi, tree, mode, sizes)])
                    for sizes in ("small", "1M")
                    for tree, _ in TREES
                ]
                print(f"| {mpi_name} | {mode} | {name} | " + " | ".join(cells) + " |")
    print("\n4 KiB-16 MiB, before -> after, the median of the runs per size\n")
    sizes = sorted(by_size(rows("mpich", "main", "sync", "sweep"), "in_place"))
    print("| MPI | mode | placement | " + " | ".join(_bytes(s) for s in sizes) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in sizes) + " |")
    for mpi, mpi_name in MPIS:
        for mode in ("sync", "async"):
            for placement, name in PLACEMENTS:
                before, after = (by_size(rows(mpi, t, mode, "sweep"), placement) for t, _ in TREES)
                cells = [f"{before[s]:.2f} -> {after[s]:.2f}" for s in sizes]
                print(f"| {mpi_name} | {mode} | {name} | " + " | ".join(cells) + " |")


def every_verb() -> None:
    print("\nEvery verb, 2 ranks, before -> after: the median over 8 B-1 KiB; 1 MiB\n")
    titles = [f"{name}, {sizes}" for _, name in MPIS for sizes in ("small", "1 MiB")]
    print("| verb | mode | placement | " + " | ".join(titles) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in titles) + " |")
    for op in OPS:
        for mode in ("sync", "async"):
            for placement, name in PLACEMENTS:
                cells = []
                for mpi, _ in MPIS:
                    for sizes in ("small", "1M"):
                        medians = []
                        for tree, _ in TREES:
                            path = HERE / f"{mpi}-every-verb" / tree / f"{op}-{mode}-{sizes}.json"
                            ratios = [
                                r["ratio"][placement]
                                for r in json.loads(path.read_text())["rows"]
                                if r["count"] > 0 and r["ratio"].get(placement) is not None
                            ]
                            medians.append(statistics.median(ratios) if ratios else None)
                        cells.append(
                            "n/a" if None in medians else f"{medians[0]:.2f} -> {medians[1]:.2f}"
                        )
                if any(c != "n/a" for c in cells):
                    print(f"| {op} | {mode} | {name} | " + " | ".join(cells) + " |")


def _bytes(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"


if __name__ == "__main__":
    main()
    every_verb()
