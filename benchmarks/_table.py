"""The nccl-tests table: one line per size, out-of-place and in-place side by side.

A row is a dict (the same one ``--json`` writes)::

    {"size": 1024, "count": 256, "type": "float32", "redop": "sum", "root": -1,
     "out_of_place": {"time_us": 12.3, "algbw": 0.08, "busbw": 0.08, "wrong": 0},
     "in_place": {...} or None,                       # None: no such form of the call
     "baseline": {"name": "mpi4py", "out_of_place": {...}, "in_place": {...}},  # --baseline
     "ratio": {"out_of_place": 1.01, "in_place": 0.99}}  # our time / the baseline's
"""

from __future__ import annotations

import statistics
from typing import Any

PLACEMENTS = ("out_of_place", "in_place")


def format_time(us: float) -> str:
    """Microseconds with nccl-tests' precision: 2 decimals below 100, 1 below 10000."""
    if us >= 10000.0:
        return f"{us:7.0f}"
    if us >= 100.0:
        return f"{us:7.1f}"
    return f"{us:7.2f}"


def _cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>6}"
    wrong = "N/A" if cell["wrong"] is None else str(cell["wrong"])
    return (
        f"  {format_time(cell['time_us'])}  {cell['algbw']:6.2f}  {cell['busbw']:6.2f}  {wrong:>6}"
    )


def _baseline_cells(row: dict[str, Any]) -> str:
    out = ""
    for placement in PLACEMENTS:
        cell, ratio = row["baseline"][placement], row["ratio"][placement]
        time = format_time(cell["time_us"]) if cell else f"{'N/A':>7}"
        out += f"  {time}  {'N/A' if ratio is None else f'{ratio:.3f}':>6}"
    return out


def header(baseline: str | None = None) -> str:
    """The three commented header lines (four with a baseline)."""
    lines = [
        f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}{'out-of-place':^33}{'in-place':^33}",
        f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}"
        + f"  {'time':>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}" * 2,
        f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}"
        + f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}" * 2,
    ]
    if baseline:
        lines[0] += f"{f'{baseline} oop':^17}{f'{baseline} ip':^17}"
        lines[1] += f"  {'time':>7}  {'ratio':>6}" * 2
        lines[2] += f"  {'(us)':>7}  {'ours/b':>6}" * 2
    return "\n".join(lines)


def format_row(row: dict[str, Any]) -> str:
    """One table line: ``size count type redop root`` then both placements.

    Example:
        >>> cell = {"time_us": 1.5, "algbw": 0.01, "busbw": 0.01, "wrong": 0}
        >>> format_row({"size": 8, "count": 2, "type": "float32", "redop": "sum",
        ...             "root": -1, "out_of_place": cell, "in_place": None})
        '           8             2   float32     sum      -1     1.50    0.01    0.01       0      N/A     N/A     N/A     N/A'
    """
    line = (
        f"  {row['size']:>10}  {row['count']:>12}  {row['type']:>8}  {row['redop']:>6}"
        f"  {row['root']:>6}" + _cell(row["out_of_place"]) + _cell(row["in_place"])
    )
    if row.get("baseline"):
        line += _baseline_cells(row)
    return line


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals nccl-tests prints last (wrong elements, mean busbw), plus the baseline's."""
    cells = [row[p] for row in rows for p in PLACEMENTS if row[p] is not None]
    wrong = sum(cell["wrong"] or 0 for cell in cells)
    out: dict[str, Any] = {
        "wrong": wrong,
        "avg_busbw": statistics.fmean(c["busbw"] for c in cells) if cells else 0.0,
    }
    based = [row for row in rows if row.get("baseline")]
    if based:
        base_cells = [r["baseline"][p] for r in based for p in PLACEMENTS if r["baseline"][p]]
        ratios = [r["ratio"][p] for r in based for p in PLACEMENTS if r["ratio"][p] is not None]
        out["baseline"] = based[0]["baseline"]["name"]
        out["baseline_wrong"] = sum(c["wrong"] or 0 for c in base_cells)
        out["baseline_avg_busbw"] = (
            statistics.fmean(c["busbw"] for c in base_cells) if base_cells else 0.0
        )
        out["median_ratio"] = statistics.median(ratios) if ratios else None
        out["ratio_range"] = [min(ratios), max(ratios)] if ratios else None
        out["timings"] = len(ratios)
        out["size_range"] = [based[0]["size"], based[-1]["size"]]
        out["checked"] = all(c["wrong"] is not None for c in cells + base_cells)
    return out


def footer(totals: dict[str, Any]) -> str:
    """nccl-tests' closing lines: out-of-bounds count and ``Avg bus bandwidth``."""
    lines = [
        f"# Out of bounds values : {totals['wrong']} {'FAILED' if totals['wrong'] else 'OK'}",
        f"# Avg bus bandwidth    : {totals['avg_busbw']:g} ",
    ]
    if "baseline" in totals:
        name = totals["baseline"]
        lines.append(
            f"# {name} out of bounds values : {totals['baseline_wrong']} "
            f"{'FAILED' if totals['baseline_wrong'] else 'OK'}"
        )
        lines.append(f"# {name} avg bus bandwidth    : {totals['baseline_avg_busbw']:g} ")
        ratio = totals["median_ratio"]
        lines.append(
            f"# Median time ratio ours/{name} : {'N/A' if ratio is None else f'{ratio:.3f}'}"
        )
        lines.append(verdict(totals))
    return "\n".join(lines)


def verdict(totals: dict[str, Any]) -> str:
    """The closing line to read at a glance: our time against the baseline's, and correctness.

    Example:
        >>> verdict({"baseline": "mpi4py", "median_ratio": 0.93, "ratio_range": [0.5, 1.2],
        ...          "timings": 22, "size_range": [8, 8 << 20], "checked": True, "wrong": 0,
        ...          "baseline_wrong": 0})
        '# Summary: ours took 0.93x the time of mpi4py (median of 22 timings, 0.50x to 1.20x, 8 B to 8 MiB; below 1 is faster); every result checked, 0 wrong'
    """
    name, ratio = totals["baseline"], totals["median_ratio"]
    if ratio is None:
        timing = f"no form of the call to time against {name}"
    else:
        low, high = totals["ratio_range"]
        first, last = (format_bytes(n) for n in totals["size_range"])
        sizes = f"at {first}" if first == last else f"{first} to {last}"
        timing = (
            f"ours took {ratio:.2f}x the time of {name} (median of {totals['timings']} timings, "
            f"{low:.2f}x to {high:.2f}x, {sizes}; below 1 is faster)"
        )
    wrong = totals["wrong"] + totals["baseline_wrong"]
    if not totals["checked"]:
        checks = "results not checked (-c 0)"
    elif wrong:
        checks = f"{wrong} WRONG elements"
    else:
        checks = "every result checked, 0 wrong"
    return f"# Summary: {timing}; {checks}"


def format_bytes(n: int) -> str:
    """``8 B``, ``64 KiB``, ``16 MiB``: the largest binary unit that divides ``n``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"
