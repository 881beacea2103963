"""The nccl-tests style table, its closing lines and the argument checks (in-process)."""

from __future__ import annotations

import numpy as np

from benchmarks import _table
from benchmarks.collective import _first_wrong_check, parse_args

CELL = {"time_us": 12.345, "algbw": 1.5, "busbw": 2.25, "wrong": 0}


def _row(**extra):
    row = {"size": 1024, "count": 256, "type": "float", "redop": "sum", "root": -1,
           "out_of_place": CELL, "in_place": dict(CELL, time_us=150.0, wrong=3)}  # fmt: skip
    row.update(extra)
    return row


def test_time_precision():
    assert _table.format_time(1.234) == "   1.23"
    assert _table.format_time(123.45) == " 123.45"
    assert _table.format_time(12345.6) == "12345.6"  # nccl-tests' getFloatStr
    assert _table.format_time(1234567.8) == "1234568"
    assert _table.float_str(123.456, 6) == "123.46" and _table.float_str(1234.56, 6) == "1234.6"


def test_row_columns_line_up_with_header():
    head = _table.header().splitlines()
    line = _table.format_row(_row())
    assert len(head) == 4 and head[2].split()[1:] == [
        "size", "count", "type", "redop", "root",
        "time", "algbw", "busbw", "#wrong", "time", "algbw", "busbw", "#wrong",
    ]  # fmt: skip
    assert line.split() == [
        "1024", "256", "float", "sum", "-1", "12.35", "1.50", "2.25", "0",
        "150.00", "1.50", "2.25", "3",
    ]  # fmt: skip
    # right edges of the numeric columns match the header's
    for word in ("#wrong", "busbw"):
        assert head[2].rfind(word) + len(word) in {
            i + 1
            for i, ch in enumerate(line)
            if ch != " " and (i + 1 == len(line) or line[i + 1] == " ")
        }


def test_missing_form_and_unchecked():
    line = _table.format_row(_row(out_of_place=None, in_place=dict(CELL, wrong=None)))
    assert line.split()[5:] == ["N/A"] * 4 + ["12.35", "1.50", "2.25", "N/A"]


def test_baseline_columns():
    row = _row(
        baseline={"name": "mpi4py", "out_of_place": dict(CELL, time_us=10.0), "in_place": None},
        ratio={"out_of_place": 1.2345, "in_place": None},
    )
    assert "mpi4py oop" in _table.header("mpi4py").splitlines()[1]
    assert _table.format_row(row).split()[13:] == ["10.00", "1.234", "N/A", "N/A"]


def test_summary_and_footer():
    rows = [_row(), _row(in_place=None)]
    totals = _table.summary(rows)
    assert totals == {"wrong": 3, "failed": 1, "avg_busbw": 2.25}
    footer = _table.footer(totals)
    # as nccl-tests: the number of results with a wrong element, not of wrong elements
    assert "# Out of bounds values : 1 FAILED" in footer
    assert "# Avg bus bandwidth    : 2.25 " in footer
    based = [_row(baseline={"name": "x", "out_of_place": CELL, "in_place": None},
                  ratio={"out_of_place": 0.5, "in_place": None})]  # fmt: skip
    totals = _table.summary(based)
    assert totals["median_ratio"] == 0.5 and totals["baseline_wrong"] == 0
    assert "# Median time ratio ours/x : 0.500" in _table.footer(totals)


def test_out_of_bounds_counts_ranks_as_nccl_tests():
    """nccl-tests' CheckData adds 1 per rank whose result had a wrong element, MPI sums the
    ranks; its #wrong is the wrong elements of the first check that found any."""
    # (ranks, checks): rank 0 right in both checks, ranks 1 and 2 wrong in the second
    assert _first_wrong_check(np.array([[0, 0], [0, 5], [0, 2]])) == (7, 2)
    # the first check that went wrong anywhere is the one reported, later ones not
    assert _first_wrong_check(np.array([[1, 9], [0, 9]])) == (1, 1)
    assert _first_wrong_check(np.array([[0, 0], [0, 0]])) == (0, 0)
    rows = [_row(in_place=dict(CELL, wrong=7, ranks_wrong=2)), _row(in_place=None)]
    totals = _table.summary(rows)
    assert (totals["wrong"], totals["failed"]) == (7, 2)
    assert "# Out of bounds values : 2 FAILED" in _table.footer(totals)
    # no cell measured (hypercube on 3 ranks): nccl-tests' 0 / 0
    assert "# Avg bus bandwidth    : -nan \n" in _table.footer(_table.summary([]), "x")


def test_parse_args():
    args = parse_args(["--op", "all_gather", "-b", "1K", "-e", "4K", "-f", "2", "-d", "int8"])
    assert args.sizes == [1024, 2048, 4096] and args.dtype == "int8" and args.rounds == 1
    assert parse_args(["--baseline", "mpi4py"]).rounds == 5
    assert parse_args(["-b", "1K", "-e", "3K", "-i", "1K"]).sizes == [1024, 2048, 3072]
