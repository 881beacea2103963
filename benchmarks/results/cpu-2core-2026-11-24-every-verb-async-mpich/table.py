"""The table in benchmarks/README.md ("Every verb, sync and async") from run.sh's JSON files.

Run: python benchmarks/results/cpu-2core-2026-11-24-every-verb-async-mpich/table.py RUN_DIR...
"""

from __future__ import annotations

import json
import statistics
import sys

OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all",
       "gather", "scatter", "sendrecv")  # fmt: skip
PLACEMENTS = (("out_of_place", "out of place"), ("in_place", "in place"))


def ratios(run: str, op: str, mode: str, sizes: str, placement: str) -> list[float]:
    """ours / mpi4py per size, rows of 0 elements left out."""
    with open(f"{run}/{op}-{mode}-{sizes}.json") as f:
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
    print(
        "| verb | mode | placement | 8 B-1 KiB, run 1: median (range) | run 2 | 1 MiB, run 1 | run 2 |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for op in OPS:
        for mode in ("sync", "async"):
            for placement, name in PLACEMENTS:
                small = [ratios(run, op, mode, "small", placement) for run in runs]
                big = [ratios(run, op, mode, "1M", placement) for run in runs]
                if any(small) or any(big):
                    cells = " | ".join(cell(v) for v in small + big)
                    print(f"| {op} | {mode} | {name} | {cells} |")


if __name__ == "__main__":
    main(sys.argv[1:])
