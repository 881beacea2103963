"""The nccl-tests table: one line per size, out-of-place and in-place side by side.

A row is a dict (the same one ``--json`` writes)::

    {"size": 1024, "count": 256, "type": "float32", "redop": "sum", "root": -1,
     "out_of_place": {"time_us": 12.3, "algbw": 0.08, "busbw": 0.08, "wrong": 0},
     "in_place": {...} or None,                       # None: no such form of the call
     "baseline": {"name": "mpi4py", "out_of_place": {...}, "in_place": {...}},  # --baseline
     "ratio": {"out_of_place": 1.01, "in_place": 0.99}}  # our time / the baseline's
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from ._cli import PROGRAMS

PLACEMENTS = ("out_of_place", "in_place")
#: the nccl-tests release whose output these programs match
NCCL_TESTS_VERSION = "2.19.6"


def float_str(value: float, width: int) -> str:
    """A number in ``width`` characters as nccl-tests prints it (``getFloatStr``): 2
    decimals if they fit, else 1, else none, else an exponent.

    Example:
        >>> float_str(1.234, 7), float_str(12345.67, 7), float_str(12345678.0, 6)
        ('   1.23', '12345.7', ' 1e+07')
    """
    for fmt in (".2f", ".1f", ".0f"):
        text = f"{value:{width}{fmt}}"
        if len(text) <= width:
            return text
    return f"{value:{width}{'.1e' if width >= 7 else '.0e'}}"


def format_time(us: float) -> str:
    """Microseconds in nccl-tests' 7 characters."""
    return float_str(us, 7)


def _cell(cell: dict[str, Any] | None) -> str:
    if cell is None:
        return f"  {'N/A':>7}  {'N/A':>6}  {'N/A':>6}  {'N/A':>6}"
    body = f"  {format_time(cell['time_us'])}  {float_str(cell['algbw'], 6)}  "
    body += float_str(cell["busbw"], 6)
    return body + ("    N/A" if cell["wrong"] is None else f"  {cell['wrong']:6g}")


def _baseline_cells(row: dict[str, Any]) -> str:
    out = ""
    for placement in PLACEMENTS:
        cell, ratio = row["baseline"][placement], row["ratio"][placement]
        time = format_time(cell["time_us"]) if cell else f"{'N/A':>7}"
        out += f"  {time}  {'N/A' if ratio is None else f'{ratio:.3f}':>6}"
    return out


def preamble(
    args: Any,
    backend: str,
    where: list[tuple],
    nodes: str | None = None,
    nccl: tuple[int, int] = (0, 0),
) -> str:
    """nccl-tests' lines before the table: its version line (``nccl``: the NCCL version
    built against and loaded, 0 on the MPI backend), ours, the run's settings and one line
    per rank (``where``: rank, pid, host, device, PCI id, device name; ``nodes``: a
    hierarchical view's nodes in words)."""
    program = PROGRAMS[args.op]
    extra = f" rounds: {args.rounds} ({args.stat})" if args.rounds > 1 else ""
    lines = [
        f"# nccl-tests version {NCCL_TESTS_VERSION} nccl-headers={nccl[0]} nccl-library={nccl[1]}",
        f"# collectives benchmark, nccl-tests {NCCL_TESTS_VERSION} output; backend "
        f"{backend}{extra}"
        + (f", hierarchical over {nodes}" if nodes else "")
        + (f" baseline: {args.baseline}" if args.baseline else "")
        + (" async: async_op=True and wait()" if args.async_op else ""),
        f"# Collective test starting: {program}",
        f"# nThread 1 nGpus 1 minBytes {args.minbytes} maxBytes {args.maxbytes} step: "
        f"{args.step} warmup iters: {args.warmup_iters} iters: {args.iters} agg iters: "
        f"{args.agg_iters} validation: {args.check} graph: 0 unalign: 0",
    ]
    lines += [_BLOCKING[args.blocking]] if args.blocking else []
    if args.parallel_init:  # accepted, and changes nothing here: one thread per process
        lines.append("# Parallel Init Enabled: threads call into NcclInitRank concurrently ")
    lines += ["#", "# Using devices"]
    for rank, pid, host, device, bus, name in where:
        lines.append(
            f"#  Rank {rank:2d} Group  0 Pid {pid:6d} on {host:>10} device {device:2d} [{bus}] {name}"
        )
    return "\n".join(lines)


_BLOCKING = {
    1: "# Blocking Enabled: wait and barrier after each inner iteration (-m) ",
    2: "# Blocking Enabled: wait after each inner iteration (-m), no barrier ",
    3: "# Blocking Enabled: wait and barrier after each outer iteration (-n); "
    "time excludes barrier ",
}


def header(baseline: str | None = None, cputime: bool = False, timestamps: bool = False) -> str:
    """nccl-tests' header: ``#`` and three commented lines (``-C``: ``cputime``; ``-S``: a
    ``timestamp`` column); a baseline's columns after."""
    time = "cputime" if cputime else "time"
    lead = f"# {'':>10}  {'':>12}  {'':>8}  {'':>6}  {'':>6}"
    # nccl-tests' " %*s": 19 wide with timestamps, else empty
    label, form = (f" {'timestamp':>19}", f" {TIMESTAMP:>19}") if timestamps else (" ", " ")
    lines = [
        "#",
        lead + "           out-of-place                       in-place          ",
        f"# {'size':>10}  {'count':>12}  {'type':>8}  {'redop':>6}  {'root':>6}"
        + f"  {time:>7}  {'algbw':>6}  {'busbw':>6}  {'#wrong':>6}" * 2
        + label,
        f"# {'(B)':>10}  {'(elements)':>12}  {'':>8}  {'':>6}  {'':>6}"
        + f"  {'(us)':>7}  {'(GB/s)':>6}  {'(GB/s)':>6}  {'':>6}" * 2
        + form,
    ]
    if baseline:
        gap = "   " if timestamps else " "  # rows' timestamps are 21 wide, one past the label
        lines[1] += (
            " " * (21 if timestamps else 0) + f"{f'{baseline} oop':^17}{f'{baseline} ip':^17}"
        )
        lines[2] += gap + f"{'time':>7}  {'ratio':>6}" + f"  {'time':>7}  {'ratio':>6}"
        lines[3] += gap + f"{'(us)':>7}  {'ours/b':>6}" + f"  {'(us)':>7}  {'ours/b':>6}"
    return "\n".join(lines)


#: nccl-tests' TIME_STRING_FORMAT, for ``-S``
TIMESTAMP = "%Y-%m-%d %H:%M:%S"


def format_row(row: dict[str, Any], timestamp: str | None = None) -> str:
    """One table line: ``size count type redop root``, both placements, ``timestamp``
    (``-S``: the local time when the row is printed), then a baseline's cells.

    Example:
        >>> cell = {"time_us": 1.5, "algbw": 0.01, "busbw": 0.01, "wrong": 0}
        >>> format_row({"size": 8, "count": 2, "type": "float", "redop": "sum",
        ...             "root": -1, "out_of_place": cell, "in_place": None})
        '           8             2     float     sum      -1     1.50    0.01    0.01       0      N/A     N/A     N/A     N/A'
    """
    line = (
        f"{row['size']:12d}  {row['count']:12d}  {row['type']:>8}  {row['redop']:>6}"
        f"  {row['root']:6d}" + _cell(row["out_of_place"]) + _cell(row["in_place"])
    )
    if timestamp is not None:
        line += f"{timestamp:>21}"
    if row.get("baseline"):
        line += _baseline_cells(row)
    return line


def summary(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Totals nccl-tests prints last (wrong elements, mean busbw), plus the baseline's."""
    cells = [row[p] for row in rows for p in PLACEMENTS if row[p] is not None]
    wrong = sum(cell["wrong"] or 0 for cell in cells)
    out: dict[str, Any] = {
        "wrong": wrong,
        # nccl-tests' "Out of bounds values": per rank, the results it found wrong, summed
        "failed": sum(cell.get("ranks_wrong", 1 if cell["wrong"] else 0) for cell in cells),
        # no cell: nccl-tests divides 0 by 0 (hypercube on a world not a power of 2)
        "avg_busbw": statistics.fmean(c["busbw"] for c in cells) if cells else math.nan,
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
        # sendrecv in place is timed, never checked (nccl-tests prints N/A): not "-c 0"
        out["some_checked"] = any(c["wrong"] is not None for c in cells)
    return out


def footer(totals: dict[str, Any], program: str = "", min_bw: float | None = None) -> str:
    """nccl-tests' closing lines: how many results were wrong, ``Avg bus bandwidth`` (``OK``
    or ``FAILED`` against ``min_bw``, nccl-tests' ``NCCL_TESTS_MIN_BW``), and, given
    ``program``, the ``Collective test concluded`` line, ``#`` and an empty line; with a
    baseline, its lines before the ``#`` and the :func:`verdict` after the concluded line."""
    lines = [
        f"# Out of bounds values : {totals['failed']} {'FAILED' if totals['failed'] else 'OK'}",
        f"# Avg bus bandwidth    : {c_g(totals['avg_busbw'])} {bandwidth_verdict(totals, min_bw)}",
    ]
    if "baseline" in totals:
        name = totals["baseline"]
        lines.append(
            f"# {name} out of bounds values : {totals['baseline_wrong']} "
            f"{'FAILED' if totals['baseline_wrong'] else 'OK'}"
        )
        lines.append(f"# {name} avg bus bandwidth    : {c_g(totals['baseline_avg_busbw'])} ")
        ratio = totals["median_ratio"]
        lines.append(
            f"# Median time ratio ours/{name} : {'N/A' if ratio is None else f'{ratio:.3f}'}"
        )
    if program:
        lines += ["#", f"# Collective test concluded: {program}"]
    if "baseline" in totals:
        lines.append(verdict(totals))  # where nccl-tests prints its -M memory line
    if program:
        lines += ["#", ""]  # nccl-tests' finalizeFooter and writeErrors (no error)
    return "\n".join(lines)


def bandwidth_verdict(totals: dict[str, Any], min_bw: float | None) -> str:
    """nccl-tests' word after the average busbw: none unless ``NCCL_TESTS_MIN_BW`` is set,
    then ``FAILED`` below 0.9 times it, else ``OK``."""
    if min_bw is None:
        return ""
    return "FAILED" if totals["avg_busbw"] < min_bw * 0.9 else "OK"


def c_g(value: float) -> str:
    """C's ``%g``: a NaN is ``-nan`` (glibc on x86-64 prints nccl-tests' 0.0 / 0.0 so).

    Example:
        >>> c_g(1.5), c_g(float("nan"))
        ('1.5', '-nan')
    """
    return "-nan" if math.isnan(value) else f"{value:g}"


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
    if not totals["checked"] and not totals.get("some_checked", False):
        checks = "results not checked (-c 0)"
    elif wrong:
        checks = f"{wrong} WRONG elements"
    elif not totals["checked"]:
        checks = "every result checked but the N/A ones, 0 wrong"
    else:
        checks = "every result checked, 0 wrong"
    return f"# Summary: {timing}; {checks}"


def format_bytes(n: int) -> str:
    """``8 B``, ``64 KiB``, ``16 MiB``: the largest binary unit that divides ``n``."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} B"
