"""The ``*_perf`` programs speak nccl-tests: its flags, names, defaults and output.

In process: every nccl-tests flag, short and long, parses to what nccl-tests makes of it,
and the header and rows match nccl-tests' own printf formats (copied from its util.cu).
Under mpiexec (2 ranks, tiny sizes): ``-d all -o all`` (and ``-r all``) sweep every type, op
and root with 0 wrong; a bad command line exits 2 with one usage line and no traceback.
"""

# nccl-tests' printf formats are kept verbatim, as %-formats, so that they read as its source
# ruff: noqa: UP031
from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from benchmarks import _cli, _table
from benchmarks._data import NCCL_TYPES, REDOPS, type_name
from tests.spmd_launcher import REPO, mpi_env, mpiexec

TIMEOUT = 180
PROGRAMS = ("all_reduce_perf", "all_gather_perf", "broadcast_perf", "reduce_perf",
            "reduce_scatter_perf", "alltoall_perf", "gather_perf", "scatter_perf",
            "sendrecv_perf", "hypercube_perf")  # fmt: skip


def _parse(argv, collective="all_reduce"):
    return _cli.parse_args(argv, collective)


def test_every_program_is_a_module_for_its_collective():
    assert sorted(_cli.PROGRAMS.values()) == sorted(PROGRAMS)
    for program in PROGRAMS:
        assert (REPO / "benchmarks" / f"{program}.py").is_file()


def test_defaults_are_nccl_tests():
    args = _parse([])
    assert args.sizes == [32 << 20] and args.step == "1048576(bytes)"
    assert (args.iters, args.warmup_iters, args.agg_iters, args.check) == (20, 1, 1, 1)
    assert [type_name(t) for t in args.types] == ["float"] and args.redops == ["sum"]
    assert args.roots == [0] and args.average == 1 and args.run_cycles == 1


@pytest.mark.parametrize(
    "short,long,value,dest,want",
    [("-t", "--nthreads", "1", "nthreads", 1), ("-g", "--ngpus", "1", "ngpus", 1),
     ("-b", "--minbytes", "1K", "minbytes", 1024), ("-e", "--maxbytes", "1G", "maxbytes", 1 << 30),
     ("-i", "--stepbytes", "128K", "stepbytes", 128 << 10),
     ("-f", "--stepfactor", "4", "stepfactor", 4), ("-n", "--iters", "7", "iters", 7),
     ("-m", "--agg_iters", "3", "agg_iters", 3), ("-w", "--warmup_iters", "0", "warmup_iters", 0),
     ("-N", "--run_cycles", "2", "run_cycles", 2), ("-p", "--parallel_init", "1", "parallel_init", 1),
     ("-c", "--check", "5", "check", 5), ("-o", "--op", "max", "redops", ["max"]),
     ("-d", "--datatype", "half", "types", [np.dtype("float16")]), ("-r", "--root", "1", "roots", [1]),
     ("-z", "--blocking", "2", "blocking", 2), ("-y", "--stream_null", "0", "stream_null", 0),
     ("-T", "--timeout", "30", "timeout", 30.0), ("-G", "--cudagraph", "0", "cudagraph", 0),
     ("-C", "--report_cputime", "1", "report_cputime", 1),
     ("-S", "--report_timestamps", "1", "report_timestamps", 1),
     ("-J", "--output_file", "out.json", "output_file", "out.json"),
     ("-a", "--average", "3", "average", 3), ("-n", "--iters", "0x10", "iters", 16),
     ("-b", "--minbytes", "1.5K", "minbytes", 1536), ("-e", "--maxbytes", "1e3", "maxbytes", 1000),
     ("-R", "--local_register", "0", "local_register", 0),
     ("-D", "--device_implementation", "0", "device_implementation", 0),
     ("-V", "--device_cta_count", "8", "device_cta_count", 8), ("-M", "--memory", "0", "memory", 0),
     ("-u", "--unalign", "0", "unalign", 0), ("-I", "--per_iter_timing", "0", "per_iter_timing", 0),
     ("-K", "--per_iter_skip", "2", "per_iter_skip", 2)],
)  # fmt: skip
def test_every_flag_short_and_long(short, long, value, dest, want):
    for argv in ([short, value], [f"{long}={value}"]):
        assert getattr(_parse(["-b", "8", "-e", "2G", *argv]), dest) == want, argv


def test_types_ops_and_roots():
    every = _parse(["-d", "all", "-o", "all", "-r", "-1"], "reduce")
    assert [type_name(t) for t in every.types] == list(NCCL_TYPES)
    assert every.redops == list(REDOPS) and every.roots is None
    combos = _cli.combinations(every, 3)
    assert len(combos) == len(NCCL_TYPES) * len(REDOPS) * 3
    assert [(type_name(t), o, r) for t, o, r in combos[:4]] == [
        ("int8", "sum", 0), ("int8", "sum", 1), ("int8", "sum", 2), ("int8", "prod", 0)]  # fmt: skip
    assert _parse(["-r", "every"], "broadcast").roots is None
    # nccl-tests reads -r with strtol: "all" is root 0
    assert _parse(["-r", "all"], "broadcast").roots == [0]
    # a collective without a reduce op or root runs once per type
    gather = _parse(["-d", "all", "-o", "all", "-r", "-1"], "all_gather")
    assert [(o, r) for _, o, r in _cli.combinations(gather, 3)] == [("none", -1)] * 10
    # sendrecv runs once per -o op, as nccl-tests (which prints the op)
    sendrecv = _parse(["-o", "all"], "sendrecv")
    assert [o for _, o, _ in _cli.combinations(sendrecv, 2)] == list(REDOPS)
    for alias, name in (("float16", "half"), ("float32", "float"), ("float64", "double")):
        assert type_name(_parse(["-d", alias]).types[0]) == name


def test_sizes_as_nccl_tests():
    assert _parse(["-b", "8", "-e", "64", "-f", "2", "-i", "1"]).sizes == [8, 16, 32, 64]
    args = _parse(["-b", "1K", "-e", "3K", "-i", "1K"])
    assert args.sizes == [1024, 2048, 3072] and args.step == "1024(bytes)"
    assert _parse(["-b", "8", "-e", "64", "-f", "2"]).step == "2(factor)"


BAD = [
    (["-b", "1G", "-e", "8"], "max_bytes (-e) must be >= min_bytes (-b)"),
     (["-b", "12X"], "size must be a byte count"), (["-n", "20x"], "expected an integer"),
     (["-d", "f8e4m3"], "no 8-bit float"), (["-o", "mulsum"], "no mulsum"),
     (["-r", "x"], "root (-r) must be a rank, -1 or every"),
     (["-t", "2"], "-t 2 is not supported here: one thread per process"),
     (["-g", "2"], "-g 2 is not supported here: one GPU per rank"),
     (["-G", "1"], "-G 1 is not supported"), (["-R", "1"], "-R 1 is not supported"),
     (["-x", "1"], "-x is not supported"), (["-N", "0"], "-N must be >= 1"),
     (["-a", "4"], "-a must be in 0..3"), (["-z", "4"], "-z must be in 0..3"),
     (["--bogus"], "unrecognized arguments: --bogus")]  # fmt: skip
# benchmarks.collective's own flags and defaults
BAD_COLLECTIVE = [(["-n", "0"], "-n must be >= 1, got 0"), (["-w", "-1"], "-w must be >= 0, got -1"),
                  (["--rounds", "0"], "--rounds must be >= 1, got 0"), (["--op", "x"], "--op: invalid"),
                  (["-b", "64", "-e", "8"], "max_bytes (-e) must be >= min_bytes")]  # fmt: skip


@pytest.mark.parametrize(
    "collective,argv,message",
    [("all_reduce", *bad) for bad in BAD] + [(None, *bad) for bad in BAD_COLLECTIVE],
)
def test_bad_flags_exit_2_with_one_usage_line(collective, argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        _parse(argv, collective)
    assert exit_.value.code == 2
    usage, error = capsys.readouterr().err.splitlines()
    prog = f"python -m benchmarks.{_cli.PROGRAMS[collective] if collective else 'collective'}"
    assert usage == f"usage: {prog} [-h] [options]"
    assert error.startswith(f"{prog}: error: ") and message in error


@pytest.mark.parametrize("flag,name,what,default", [("-d", "float8", "type", "float"),
                                                    ("-o", "mean", "op", "sum")])  # fmt: skip
def test_unknown_type_or_op_warns_and_falls_back_as_nccl_tests(flag, name, what, default, capsys):
    args = _parse([flag, name])
    assert capsys.readouterr().out == "invalid %s %s, defaulting to %s .. \n" % (
        what,
        name,
        default,
    )
    assert [type_name(t) for t in args.types] == ["float"] and args.redops == ["sum"]


def test_header_and_rows_are_nccl_tests_printf():
    """Golden lines: nccl-tests' util.cu formats, applied with C printf semantics."""
    head = _table.header().splitlines()
    assert head == [
        "#",
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
        % ("", "", "", "", ""),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %0s"
        % ("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong",
           "time", "algbw", "busbw", "#wrong", ""),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %0s"
        % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
           "(GB/s)", "", ""),
    ]  # fmt: skip
    assert _table.header(cputime=True).splitlines()[2].split()[6] == "cputime"
    stamped = _table.header(timestamps=True).splitlines()
    assert stamped[2] == head[2][:-1] + " %*s" % (19, "timestamp")
    assert stamped[3] == head[3][:-1] + " %*s" % (19, "%Y-%m-%d %H:%M:%S")
    cell = {"time_us": 123456.7, "algbw": 12.345, "busbw": 23.5, "wrong": 0}
    row = {"size": 33554432, "count": 8388608, "type": "float", "redop": "sum", "root": -1,
           "out_of_place": cell, "in_place": dict(cell, wrong=None)}  # fmt: skip
    stamp = "2026-11-23 21:00:00"
    assert _table.format_row(row, stamp) == _table.format_row(row) + "%21s" % stamp
    assert _table.format_row(row) == (
        "%12li  %12li  %8s  %6s  %6s" % (33554432, 8388608, "float", "sum", "%6i" % -1)
        + "  %7s  %6s  %6s  %6g" % (" 123457", " 12.35", " 23.50", 0)
        + "  %7s  %6s  %6s    N/A" % (" 123457", " 12.35", " 23.50")
    )
    totals = {"wrong": 0, "failed": 0, "avg_busbw": 23.5}
    assert _table.footer(totals, "all_reduce_perf").split("\n") == [
        "# %-20s : %d %s" % ("Out of bounds values", 0, "OK"),
        "# %-20s : %g %s" % ("Avg bus bandwidth", 23.5, ""),
        "#",
        "# Collective test concluded: all_reduce_perf",
        "#",  # finalizeFooter
        "",  # writeErrors: an empty line when NCCL reports no error
    ]
    # NCCL_TESTS_MIN_BW: OK at or above 0.9 times it, else FAILED
    assert _table.footer(totals, "x", min_bw=26.0).split("\n")[1].endswith(" 23.5 OK")
    assert _table.footer(totals, "x", min_bw=26.2).split("\n")[1].endswith(" 23.5 FAILED")


def _launch(argv: list[str]) -> subprocess.CompletedProcess:
    try:
        with mpi_env() as env:
            return subprocess.run(
                [mpiexec(), "-n", "2", sys.executable, *argv],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT,
            )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"benchmark hung (killed after {TIMEOUT} s): {exc.output}")


DRIVER = """
import runpy, sys
tiny = ["-b", "16", "-e", "16", "-n", "1", "-w", "0"]
# the flags that change how calls are timed, each on one program
timing = {"all_gather_perf": ["-a", "0", "-m", "2", "-z", "1", "-c", "3"],
          "alltoall_perf": ["-a", "3", "-z", "2", "-C", "1", "-T", "30", "-S", "1"],
          "sendrecv_perf": ["-a", "2", "-z", "3", "-N", "2"],
          "hypercube_perf": ["-b", "32", "-e", "32"]}  # whole 16-byte chunks per rank
for program, extra in (("all_reduce_perf", ["-d", "all", "-o", "all"]),
                       ("reduce_perf", ["-d", "bfloat16", "-o", "all", "-r", "-1"])) + tuple(
        (p, ["-d", "all", "-r", "-1", *timing.get(p, [])]) for p in sys.argv[1:]):
    sys.argv = [program, *tiny, *extra]
    try:
        runpy.run_module(f"benchmarks.{program}", run_name="__main__")
    except SystemExit as exit_:
        assert exit_.code == 0, (program, exit_.code)
"""
OTHERS = ("all_gather_perf", "broadcast_perf", "reduce_scatter_perf", "alltoall_perf",
          "gather_perf", "scatter_perf", "sendrecv_perf", "hypercube_perf")  # fmt: skip


def _rows(table: str) -> list[tuple[str, str, str]]:
    """(type, redop, root) of each row of one program's table; every row checked, 0 wrong."""
    rows = []
    for line in table.splitlines()[1:]:
        if line.startswith("#") or not line:
            continue
        # "%12li  %12li  %8s  %6s  %6s": by position, as hypercube's redop is blank
        lead = [line[0:12], line[14:26], line[28:36], line[38:44], line[46:52]]
        cols = [c.strip() for c in lead] + line[52:].split()
        if len(cols) == 15:  # -S: the local time, as nccl-tests' "%Y-%m-%d %H:%M:%S"
            assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", " ".join(cols[13:])), line
            cols = cols[:13]
        assert len(cols) == 13, line
        assert [cols[8], cols[12]] in (["0", "0"], ["0", "N/A"]), line
        rows.append((cols[2], cols[3], cols[4]))
    return rows


def test_every_program_sweeps_every_type_op_and_root_with_0_wrong():
    """Each ``*_perf`` module run as a program (one launch), at 16 bytes on 2 ranks."""
    proc = _launch(["-c", DRIVER, *OTHERS])
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    tables = dict(t.split("\n", 1) for t in proc.stdout.split("# Collective test starting: ")[1:])
    assert list(tables) == ["all_reduce_perf", "reduce_perf", *OTHERS]
    for program, table in tables.items():
        agg, check = ("2", "3") if program == "all_gather_perf" else ("1", "1")
        size = 32 if program == "hypercube_perf" else 16
        assert (
            f"# nThread 1 nGpus 1 minBytes {size} maxBytes {size} step: 1048576(bytes) warmup iters: 0 "
            f"iters: 1 agg iters: {agg} validation: {check} graph: 0 unalign: 0\n" in table
        )
        assert table.count("#  Rank ") == 2 and "# Out of bounds values : 0 OK" in table
        assert f"# Collective test concluded: {program}\n" in table
    assert _rows(tables["all_reduce_perf"]) == [(t, o, "-1") for t in NCCL_TYPES for o in REDOPS]
    assert _rows(tables["reduce_perf"]) == [("bfloat16", o, r) for o in REDOPS for r in "01"]
    assert _rows(tables["reduce_scatter_perf"]) == [(t, "sum", "-1") for t in NCCL_TYPES]
    for program in ("broadcast_perf", "gather_perf", "scatter_perf"):
        assert _rows(tables[program]) == [(t, "none", r) for t in NCCL_TYPES for r in "01"]
    for program in ("all_gather_perf", "alltoall_perf"):
        assert _rows(tables[program]) == [(t, "none", "-1") for t in NCCL_TYPES]
    assert _rows(tables["hypercube_perf"]) == [(t, "", "-1") for t in NCCL_TYPES]
    # -N 2: each type's sweep twice before the next type's, as nccl-tests
    assert _rows(tables["sendrecv_perf"]) == [(t, "sum", "-1") for t in NCCL_TYPES for _ in "12"]
    assert "    N/A\n" in tables["sendrecv_perf"]  # in place: timed, not checked
    assert "# Blocking Enabled: wait and barrier after each inner" in tables["all_gather_perf"]
    assert "# Blocking Enabled: wait after each inner" in tables["alltoall_perf"]
    assert "  cputime   algbw" in tables["alltoall_perf"]
    assert "  #wrong           timestamp\n" in tables["alltoall_perf"]


@pytest.mark.parametrize("argv", [["-b", "1G", "-e", "8"], ["-d", "f8e5m2"], ["-r", "2"]])
def test_bad_arguments_under_mpiexec_exit_2_on_rank_0_only(argv):
    proc = _launch(["-m", "benchmarks.reduce_perf", "-b", "8", "-e", "8", *argv])
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert lines.count("usage: python -m benchmarks.reduce_perf [-h] [options]") == 1, lines
    assert sum(line.startswith("python -m benchmarks.reduce_perf: error: ") for line in lines) == 1
