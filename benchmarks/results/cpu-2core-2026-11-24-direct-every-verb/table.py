"""The tables in benchmarks/README.md ("Every verb through the direct path") from run.sh's JSON.

Run: python benchmarks/results/cpu-2core-2026-11-24-direct-every-verb/table.py RUN_DIR...
(each RUN_DIR one tree's files, e.g. OUT_DIR/before OUT_DIR/fast: one column pair each).
"""

from __future__ import annotations

import json
import os
import statistics
import sys

OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all",
       "gather", "scatter", "sendrecv")  # fmt: skip
PLACEMENTS = (("out_of_place", "out of place"), ("in_place", "in place"))


def ratios(run: str, op: str, mode: str, sizes: str, placement: str) -> list[float]:
    """ours / mpi4py per size, rows of 0 elements left out."""
    path = f"{run}/{op}-{mode}-{sizes}.json"
    if not os.path.exists(path):
        return []
    with open(path) as f:
        rows = json.load(f)["rows"]
    return [
        r["ratio"][placement]
        for r in rows
        if r["count"] > 0 and r["ratio"].get(placement) is not None
    ]


def cell(values: list[float]) -> str:
    if not values:
        return "n/a"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


def main(runs: list[str]) -> None:
    names = [os.path.basename(r.rstrip("/")) for r in runs]
    big = any(f.endswith("-1M.json") for r in runs for f in os.listdir(r))
    head = [f"small, {n}: median (range)" for n in names]
    head += [f"1 MiB, {n}" for n in names] if big else []
    print("| verb | mode | placement | " + " | ".join(head) + " |")
    print("| --- | --- | --- | " + " | ".join("---" for _ in head) + " |")
    for op in OPS:
        for mode in ("sync", "async"):
            for placement, name in PLACEMENTS:
                cells = [ratios(run, op, mode, "small", placement) for run in runs]
                if big:
                    cells += [ratios(run, op, mode, "1M", placement) for run in runs]
                if any(cells):
                    print(
                        f"| {op} | {mode} | {name} | " + " | ".join(cell(v) for v in cells) + " |"
                    )


if __name__ == "__main__":
    main(sys.argv[1:])
