"""The closing summary line of a run with a baseline, computed from real table rows."""

from __future__ import annotations

from benchmarks import _table


def _cell(time_us: float, wrong: int | None = 0) -> dict:
    return {"time_us": time_us, "algbw": 1.0, "busbw": 1.0, "wrong": wrong}


def _row(size: int, ours: float, base: float, wrong: int | None = 0) -> dict:
    """A row whose two forms took ``ours`` and ``2 * ours`` us, against ``base`` us each."""
    return {
        "size": size, "count": size // 4, "type": "float32", "redop": "sum", "root": -1,
        "out_of_place": _cell(ours, wrong), "in_place": _cell(2 * ours, wrong),
        "baseline": {"name": "mpi4py", "out_of_place": _cell(base), "in_place": _cell(base)},
        "ratio": {"out_of_place": ours / base, "in_place": 2 * ours / base},
    }  # fmt: skip


def test_summary_line_gives_the_median_ratio_its_spread_and_the_sizes():
    rows = [_row(8, 1.0, 4.0), _row(1 << 10, 3.0, 4.0), _row(8 << 20, 4.0, 5.0)]
    # ratios 0.25, 0.5, 0.75, 1.5, 0.8, 1.6: median (0.75 + 0.8) / 2
    line = _table.footer(_table.summary(rows)).splitlines()[-1]
    assert line == (
        "# Summary: ours took 0.78x the time of mpi4py (median of 6 timings, 0.25x to 1.60x, "
        "8 B to 8 MiB; below 1 is faster); every result checked, 0 wrong"
    )


def test_summary_line_says_when_results_were_wrong_or_not_checked():
    wrong = _table.summary([_row(64, 1.0, 1.0, wrong=2)])
    assert "1.00x to 2.00x, at 64 B; below" in _table.verdict(wrong)
    assert _table.verdict(wrong).endswith("; 4 WRONG elements")
    unchecked = _table.summary([_row(64, 1.0, 1.0, wrong=None)])
    assert _table.verdict(unchecked).endswith("; results not checked (-c 0)")
    # sendrecv's in-place form is timed, never checked (N/A): the rest was checked
    row = _row(64, 1.0, 1.0)
    row["in_place"]["wrong"] = row["baseline"]["in_place"]["wrong"] = None
    partly = _table.summary([row])
    assert _table.verdict(partly).endswith("; every result checked but the N/A ones, 0 wrong")


def test_sizes_are_written_in_binary_units():
    assert [_table.format_bytes(n) for n in (8, 1000, 1024, 3 << 20, 1 << 30)] == [
        "8 B", "1000 B", "1 KiB", "3 MiB", "1 GiB",
    ]  # fmt: skip
