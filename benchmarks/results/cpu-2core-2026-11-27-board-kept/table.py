"""The tables in benchmarks/README.md ("The board's words apart, MPICH's small calls kept")
from the JSON of run.sh and run_1m.sh: python table.py

Ours / mpi4py per verb, mode and placement, median (range): 2 ranks, 8 B-1 KiB (run.sh, this
tree) and 1 MiB (run_1m.sh's three runs); 4 ranks, 1 KiB; then the 2 ranks' 8 B-1 KiB before
(the tree before) and after (this tree).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all",
       "gather", "scatter", "sendrecv")  # fmt: skip
PLACEMENTS = (("out_of_place", "out of place"), ("in_place", "in place"))
MPIS = (("mpich", "MPICH"), ("openmpi", "Open MPI"), ("impi", "Intel MPI"))


def ratios(folder: Path, op: str, mode: str, sizes: str, placement: str) -> list[float]:
    """ours / mpi4py per size, rows of 0 elements left out."""
    path = folder / f"{op}-{mode}-{sizes}.json"
    if not path.exists():
        return []
    rows = json.loads(path.read_text())["rows"]
    return [r["ratio"][placement] for r in rows
            if r["count"] > 0 and r["ratio"].get(placement) is not None]  # fmt: skip


def cell(values: list[float]) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def table(columns: list[tuple[str, list[Path], str]]) -> None:
    """One row per verb, mode and placement; a column (title, folders, sizes) holds the
    values of every size in each of its folders."""
    print("| verb | mode | placement | " + " | ".join(t for t, _, _ in columns) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in columns) + " |")
    for op in OPS:
        for mode in ("sync", "async"):
            for placement, name in PLACEMENTS:
                cells = [[v for f in folders for v in ratios(f, op, mode, sizes, placement)]
                         for _, folders, sizes in columns]  # fmt: skip
                if any(cells):
                    print(f"| {op} | {mode} | {name} | " + " | ".join(map(cell, cells)) + " |")


def main() -> None:
    print("2 ranks: 8 B-1 KiB (run.sh), 1 MiB (run_1m.sh, three runs)\n")
    small = [(f"{n}, small", [HERE / f"{m}-np2" / "main"], "small") for m, n in MPIS]
    big = [(f"{n}, 1 MiB", sorted((HERE / f"{m}-1m").glob("run*")), "1M") for m, n in MPIS]
    table(small + big)
    print("\n4 ranks on the 2 cores, 1 KiB\n")
    table([(n, [HERE / f"{m}-np4" / "main"], "small") for m, n in MPIS])
    print("\n2 ranks, 8 B-1 KiB: the tree before, then this one\n")
    table([(f"{n}: before", [HERE / f"{m}-np2" / "before"], "small") for m, n in MPIS]
          + [(f"{n}: after", [HERE / f"{m}-np2" / "main"], "small") for m, n in MPIS])  # fmt: skip


if __name__ == "__main__":
    main()
