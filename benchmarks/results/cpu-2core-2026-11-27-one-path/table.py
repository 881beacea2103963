"""The tables in benchmarks/README.md ("One call path, in Python") from run.sh's JSON:
python table.py

Per verb, mode and placement, on each MPI: the median over the sizes of ours / raw mpi4py and
of the time ours adds (us), at 1 and 2 ranks for 8 B-1 KiB, and ours / raw mpi4py at 1 MiB
(2 ranks). Synchronous calls are measured against mpi4py's blocking call, async ones
(``f(..., async_op=True).wait()``) against its non-blocking call and ``Wait``.
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


def rows(name: str, np_: int, op: str, mode: str, sizes: str) -> list[dict]:
    path = HERE / f"{name}-np{np_}" / f"{op}-{mode}-{sizes}.json"
    return (
        [r for r in json.loads(path.read_text())["rows"] if r["count"] > 0] if path.exists() else []
    )


def pairs(found: list[dict], placement: str) -> list[tuple[float, float]]:
    """(ours, raw) in us per size."""
    return [(r[placement]["time_us"], r["baseline"][placement]["time_us"])
            for r in found if r.get(placement) and r["baseline"].get(placement)]  # fmt: skip


def small(found: list[dict], placement: str) -> str:
    got = pairs(found, placement)
    if not got:
        return "n/a"
    ratio = statistics.median(o / b for o, b in got)
    added = statistics.median(o - b for o, b in got)
    return f"{ratio:.2f}x {added:+.1f}"


def large(found: list[dict], placement: str) -> str:
    got = pairs(found, placement)
    return f"{statistics.median(o / b for o, b in got):.2f}x" if got else "n/a"


def main() -> None:
    for name, title in MPIS:
        print(f"\n{title}: ours / raw mpi4py and us added (medians over 8 B-1 KiB); 1 MiB ratio\n")
        print("| verb | mode | placement | 1 rank, small | 2 ranks, small | 2 ranks, 1 MiB |")
        print("| --- | --- | --- | --- | --- | --- |")
        for op in OPS:
            for mode in ("sync", "async"):
                one, two = rows(name, 1, op, mode, "small"), rows(name, 2, op, mode, "small")
                big = rows(name, 2, op, mode, "1M")
                for placement, label in PLACEMENTS:
                    cells = [small(one, placement), small(two, placement), large(big, placement)]
                    if any(c != "n/a" for c in cells):
                        print(f"| {op} | {mode} | {label} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
