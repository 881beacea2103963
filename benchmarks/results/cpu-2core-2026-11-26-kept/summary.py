"""Medians (ranges) of ours / mpi4py per op and placement, one column per form of the call:
python summary.py [FOLDER] (default: this script's folder)."""

import json
import statistics
import sys
from pathlib import Path

here = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent)
OPS = "all_reduce reduce broadcast all_gather reduce_scatter all_to_all gather scatter".split()


def ratios(path: Path, placement: str) -> list[float]:
    rows = json.loads(path.read_text())["rows"]
    return [r["ratio"][placement] for r in rows if r["ratio"].get(placement) is not None]


def cell(values: list[float]) -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return f"{values[0]:.2f}"
    return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"


for run in sorted(p for p in here.iterdir() if p.is_dir()):
    forms = sorted(p.name for p in run.iterdir() if p.is_dir())
    print(f"\n{run.name}: ours / mpi4py, {' | '.join(forms)}")
    for op in OPS:
        for placement in ("out_of_place", "in_place"):
            got = [ratios(run / f / f"{op}-sync-small.json", placement)
                   if (run / f / f"{op}-sync-small.json").exists() else []
                   for f in forms]  # fmt: skip
            if any(got):
                print(f"  {op:14s} {placement:12s} " + " | ".join(f"{cell(g):22s}" for g in got))
