"""Each ``*_perf`` program's output, line by line, is what nccl-tests' printf formats give.

Every program runs once under mpiexec (2 ranks, tiny sizes) with ``-J``; the expected
output is then built here from nccl-tests' own format strings (``src/util.cu``,
``src/common.cu`` of v2.19.6, copied as %-formats) applied to the numbers in the ``-J``
file, and compared with what the program printed, line for line. The sizes and counts are
checked against nccl-tests' ``GetCollByteCount`` formulas written out here, the row order
against its loops (types, ops, roots, then ``-N`` sweeps of the sizes), and the ``-J`` file
is read by nccl-tests' own ``tools/analyze_perf_json.py`` (``tests/upstream``). At 3 ranks:
the 16-byte trimming of per-rank counts, and hypercube's skip line on every rank with an
average of ``-nan``.
"""

# nccl-tests' printf formats are kept verbatim, as %-formats, so that they read as its source
# ruff: noqa: UP031
from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import _nccl_json
from tests.spmd_launcher import REPO, mpi_env, mpiexec

TIMEOUT = 240
ITEMSIZE = {"int8": 1, "uint8": 1, "int32": 4, "uint32": 4, "int64": 8, "uint64": 8, "half": 2,
            "float": 4, "double": 8, "bfloat16": 2}  # fmt: skip
REDOPS = ["sum", "prod", "max", "min", "avg"]
SIZES = ["-b", "8", "-e", "32", "-f", "2"]  # 8 and 16 bytes: no whole block per rank (count 0)
# each program's flags beyond the sizes (and -J), chosen to cover the output's variants
RUNS = {
    "all_reduce_perf": ["-d", "half", "-o", "max"],
    "all_gather_perf": ["-d", "int8"],
    "broadcast_perf": ["-r", "1"],
    "reduce_perf": ["-b", "32", "-e", "32", "-o", "all", "-r", "-1", "-N", "2"],
    "reduce_scatter_perf": ["-d", "double", "-o", "prod"],
    "alltoall_perf": ["-C", "1", "-z", "2"],
    "gather_perf": ["-d", "bfloat16", "-r", "0x1"],
    "scatter_perf": ["-c", "0", "-p", "1"],
    "sendrecv_perf": ["-b", "16", "-e", "16", "-o", "all"],
    "hypercube_perf": ["-d", "uint8"],
}
DRIVER = """
import json, runpy, sys
out = sys.argv[1]
for program, extra in json.loads(sys.argv[2]).items():
    sys.argv = [program, "-n", "2", "-w", "1", *extra, "-J", f"{out}/{program}.json"]
    try:
        runpy.run_module(f"benchmarks.{program}", run_name="__main__")
    except SystemExit as exit_:
        assert exit_.code == 0, (program, exit_.code)
"""


def get_float_str(value: float, width: int) -> str:
    """nccl-tests' getFloatStr: snprintf(str, width + 1, ...) keeps ``width`` characters."""
    for fmt in ("%*.2f", "%*.1f", "%*.0f"):
        text = fmt % (width, value)
        if len(text) <= width:
            return text
    return ((width >= 7 and "%*.1e" or "%*.0e") % (width, value))[:width]


def c_g(value: float | str) -> str:
    """printf's %g; nccl-tests' 0.0 / 0.0 prints as -nan (glibc, x86-64)."""
    return "-nan" if value == "nan" else "%g" % value


def per_rank_count(program: str, nbytes: int, itemsize: int, nranks: int) -> tuple[int, int]:
    """(size column, count column) from nccl-tests' setupArgs and GetCollByteCount."""
    count = nbytes // itemsize
    if program in ("all_reduce_perf", "broadcast_perf", "reduce_perf", "sendrecv_perf"):
        return count * itemsize, count
    base = (count // nranks) & ~(16 // itemsize - 1)
    return base * nranks * itemsize, base  # max(sendBytes, expectedBytes)


def expected_lines(program: str, doc: dict, path: str, ours: str) -> list[str]:
    """The whole output nccl-tests would print for the numbers in ``doc`` (its -J file);
    ``ours``: the line where this library says what it is (not nccl-tests')."""
    c = doc["config"]
    step, kind = (c["step_factor"], "factor") if "step_factor" in c else (c["step_bytes"], "bytes")
    cputime = any("cpu_time" in (r["out_of_place"] or {}) for r in doc["results"])
    lines = [
        "# Writing JSON output to %s" % path,
        "# nccl-tests version %s nccl-headers=%d nccl-library=%d" % ("2.19.6", 0,
                                                                     doc["nccl_version"]),
        ours,
        "# Collective test starting: %s" % program,
        "# nThread %d nGpus %d minBytes %ld maxBytes %ld step: %ld(%s) warmup iters: %d iters: %d "
        "agg iters: %d validation: %d graph: %d unalign: %d"
        % (c["nthreads"], c["ngpus"], c["minimum_bytes"], c["maximum_bytes"], step, kind,
           c["warmup_iters"], c["iterations"], c["aggregated_iterations"], c["validation"],
           c["graph"], 0),
    ]  # fmt: skip
    if c["blocking_collectives"] == "true":  # -z 2 in these runs
        lines.append("# Blocking Enabled: wait after each inner iteration (-m), no barrier ")
    if c["parallel_init"] == "true":
        lines.append("# Parallel Init Enabled: threads call into NcclInitRank concurrently ")
    lines += ["#", "# Using devices"]
    for d in c["devices"]:
        lines.append("#  Rank %2d Group %2d Pid %6d on %10s device %2d [%s] %s"
                     % (d["rank"], d["group"], d["pid"], d["hostname"], d["device"],
                        d["device_hex"], d["device_info"]))  # fmt: skip
    time = "cputime" if cputime else "time"
    lines += [
        "#",
        "# %10s  %12s  %8s  %6s  %6s           out-of-place                       in-place          "
        % ("", "", "", "", ""),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s"
        % ("size", "count", "type", "redop", "root", time, "algbw", "busbw", "#wrong",
           time, "algbw", "busbw", "#wrong", 0, ""),
        "# %10s  %12s  %8s  %6s  %6s  %7s  %6s  %6s  %6s  %7s  %6s  %6s  %6s %*s"
        % ("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
           "(GB/s)", "", 0, ""),
    ]  # fmt: skip
    for r in doc["results"]:
        line = "%12li  %12li  %8s  %6s  %6s" % (r["size"], r["count"], r["type"], r["redop"],
                                                r["root"])  # fmt: skip
        for placement in ("out_of_place", "in_place"):
            cell = r[placement]
            t, a, b = (get_float_str(cell[k], w) for k, w in ((time.replace("cputime",
                       "cpu_time"), 7), ("alg_bw", 6), ("bus_bw", 6)))  # fmt: skip
            if cell["nwrong"] is None:
                line += "  %7s  %6s  %6s    N/A" % (t, a, b)
            else:
                line += "  %7s  %6s  %6s  %6g" % (t, a, b, cell["nwrong"])
        lines.append(line)
    oob, bw = doc["out_of_bounds"]["count"], doc["average_bus_bandwidth"]["bandwidth"]
    lines += [
        "# %-20s : %d %s" % ("Out of bounds values", oob, "FAILED" if oob else "OK"),
        "# %-20s : %s %s" % ("Avg bus bandwidth", c_g(bw), ""),
        "#",
        "# Collective test concluded: %s" % program,
        "#",  # finalizeFooter
        "",  # writeErrors, without an error
    ]
    return lines


def _launch(n: int, tmp_path: Path, runs: dict[str, list[str]]) -> str:
    try:
        with mpi_env() as env:
            proc = subprocess.run(
                [mpiexec(), "-n", str(n), sys.executable, "-c", DRIVER, str(tmp_path),
                 json.dumps(runs)],
                cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT,
            )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"benchmark hung (killed after {TIMEOUT} s): {exc.output}")
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


def _outputs(stdout: str) -> dict[str, list[str]]:
    """Each program's lines, from its "# Writing JSON output to" line to the next one."""
    chunks = stdout.split("# Writing JSON output to ")[1:]
    out = {}
    for chunk in chunks:
        # hypercube's skip line comes from every rank, whenever each gets there
        lines = [line for line in ("# Writing JSON output to " + chunk).splitlines()
                 if not line.startswith("nRanks ")]  # fmt: skip
        out[Path(lines[0].split()[-1]).stem] = lines
    return out


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> tuple[Path, dict[str, list[str]]]:
    tmp = tmp_path_factory.mktemp("perf")
    runs = {program: [*SIZES, *extra] for program, extra in RUNS.items()}
    return tmp, _outputs(_launch(2, tmp, runs))


@pytest.mark.parametrize("program", list(RUNS))
def test_output_is_nccl_tests_printf_line_by_line(two_ranks, program):
    tmp, outputs = two_ranks
    path = tmp / f"{program}.json"
    doc = json.loads(path.read_text())
    got = outputs[program]
    assert got[2].startswith("# collectives benchmark, nccl-tests 2.19.6 output; backend mpi")
    want = expected_lines(program, doc, str(path), got[2])
    assert got == want


@pytest.mark.parametrize("program", list(RUNS))
def test_json_rows_are_nccl_tests_rows(two_ranks, program):
    """Keys and types as util.cu writes them; sizes, counts, order and totals as its loops
    and formulas make them."""
    tmp, _ = two_ranks
    doc = json.loads((tmp / f"{program}.json").read_text())
    assert list(doc) == ["version", "start_time", "args", "env", "nccl_version", "config",
                         "results", "out_of_bounds", "average_bus_bandwidth", "errors",
                         "end_time"]  # fmt: skip
    assert doc["version"] == 3 and doc["errors"] == [""] and doc["nccl_version"] == 0
    assert doc["args"][-2:] == ["-J", str(tmp / f"{program}.json")]
    assert any(e.startswith("PATH=") for e in doc["env"])
    extra = RUNS[program]
    n, iters = 2, 2
    dtype = extra[extra.index("-d") + 1] if "-d" in extra else "float"
    sizes = [32] if "-e" in extra and extra[extra.index("-e") + 1] == "32" else [8, 16, 32]
    sizes = [16] if program == "sendrecv_perf" else sizes
    ops = {"all_reduce_perf": ["max"], "reduce_scatter_perf": ["prod"], "reduce_perf": REDOPS,
           "sendrecv_perf": REDOPS}.get(program, ["none"])  # fmt: skip
    ops = [""] if program == "hypercube_perf" else ops
    roots = {"broadcast_perf": [1], "gather_perf": [1], "scatter_perf": [0],
             "reduce_perf": [0, 1]}.get(program, [-1])  # fmt: skip
    cycles = 2 if "-N" in extra else 1
    want = [(op, "%6i" % root, per_rank_count(program, size, ITEMSIZE[dtype], n))
            for op in ops for root in roots for _ in range(cycles) for size in sizes]  # fmt: skip
    got = [(r["redop"], r["root"], (r["size"], r["count"])) for r in doc["results"]]
    assert got == want
    busbw = []
    for r in doc["results"]:
        assert r["type"] == dtype and r["actual_iterations"] == iters
        assert r["experiment_name"] == ""
        for placement in ("out_of_place", "in_place"):
            cell = r[placement]
            time = "cpu_time" if "-C" in extra else "time"
            assert list(cell) == [time, "alg_bw", "bus_bw", "nwrong"]
            assert isinstance(cell[time], float) and cell[time] > 0
            unchecked = "-c" in extra or (program == "sendrecv_perf" and placement == "in_place")
            assert cell["nwrong"] == (None if unchecked else 0.0)
            busbw.append(cell["bus_bw"])
    assert doc["out_of_bounds"] == {"count": 0, "okay": "true"}
    avg = doc["average_bus_bandwidth"]
    assert avg["okay"] == "unchecked"
    assert avg["bandwidth"] == pytest.approx(statistics.fmean(busbw), rel=1e-12, abs=1e-300)


def test_nccl_tests_analyze_perf_json_reads_our_file(two_ranks):
    """nccl-tests' own tools/analyze_perf_json.py, unchanged, on our -J file."""
    tmp, _ = two_ranks
    tool = REPO / "tests" / "upstream" / "analyze_perf_json.py"
    path = tmp / "all_reduce_perf.json"
    for flags in ([], ["--all"], ["--in-place", "--all"]):
        proc = subprocess.run([sys.executable, str(tool), str(path), *flags],
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert "  Version:    3\n" in proc.stdout and "  Results:    3\n" in proc.stdout
        assert "  Iterations: 2  (agg: 1)\n" in proc.stdout
    # without -I there are no per-iteration figures: the tool says so, as for nccl-tests'
    assert "No per-process data available." in proc.stdout


def test_three_ranks_trim_counts_and_skip_hypercube(tmp_path):
    """At 3 ranks nccl-tests prints 64 bytes of float all_gather as "48 4"; hypercube
    prints its skip line on every rank and averages no bandwidth to -nan."""
    runs = {"all_gather_perf": ["-b", "64", "-e", "64"], "hypercube_perf": ["-b", "64", "-e", "64"]}
    stdout = _launch(3, tmp_path, runs)
    outputs = _outputs(stdout)
    row = [line for line in outputs["all_gather_perf"] if not line.startswith("#")][0]
    assert row.startswith("%12li  %12li  %8s  %6s  %6s" % (48, 4, "float", "none", "%6i" % -1))
    assert stdout.count("nRanks 3 is not a power of 2, skipping") == 3, stdout
    doc = json.loads((tmp_path / "hypercube_perf.json").read_text())
    assert doc["results"] == [] and doc["average_bus_bandwidth"]["bandwidth"] == "nan"
    lines = outputs["hypercube_perf"]
    ours = lines[2]
    assert lines == expected_lines("hypercube_perf", doc, str(tmp_path / "hypercube_perf.json"),
                                   ours)  # fmt: skip


def test_a_run_killed_mid_sweep_leaves_every_row_it_printed(tmp_path):
    """Both JSON files are rewritten whole after every row: SIGKILL mid-sweep leaves valid
    documents holding the rows measured so far (nccl-tests' with no end_time yet)."""
    upstream, ours = tmp_path / "run.json", tmp_path / "ours.json"
    argv = [mpiexec(), "-n", "2", sys.executable, "-m", "benchmarks.all_reduce_perf", "-b", "1K",
            "-e", "128M", "-f", "2", "-n", "20", "-J", str(upstream), "--json", str(ours)]  # fmt: skip
    with mpi_env() as env:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, text=True, start_new_session=True)  # fmt: skip
        try:
            deadline = time.monotonic() + TIMEOUT
            while time.monotonic() < deadline and proc.poll() is None:
                time.sleep(0.05)
                try:
                    rows = json.loads(ours.read_text())["rows"]
                except (OSError, ValueError):  # not written yet: a partial file is a failure below
                    continue
                if len(rows) >= 3:
                    break
        finally:
            os.killpg(proc.pid, signal.SIGKILL)
            printed = proc.communicate(timeout=60)[0]
    assert proc.returncode == -signal.SIGKILL, "the sweep ended before it could be stopped"
    doc, mine = json.loads(upstream.read_text()), json.loads(ours.read_text())
    assert "end_time" not in doc and "out_of_bounds" not in doc and mine["complete"] is False
    rows = [line.split() for line in printed.splitlines() if line and not line.startswith("#")]
    assert len(doc["results"]) >= 3 and len(mine["rows"]) >= 3
    # the rows in order, each whole; those printed before the kill reached us agree
    sizes = [1024 << k for k in range(len(doc["results"]))]
    assert [r["size"] for r in doc["results"]] == sizes
    assert [r["size"] for r in mine["rows"]] == [1024 << k for k in range(len(mine["rows"]))]
    common = min(len(rows), len(sizes))
    assert [int(r[0]) for r in rows[:common]] == sizes[:common]
    for r in doc["results"]:
        assert r["out_of_place"]["nwrong"] == 0.0 and r["in_place"]["nwrong"] == 0.0


def test_json_name_rules_as_nccl_tests(tmp_path, monkeypatch):
    """-J writes only a name ending in .json, and never over a file: PATH.0, PATH.1..."""
    monkeypatch.chdir(tmp_path)
    assert [_nccl_json.wants_json(p) for p in ("a.json", "a.JSON", "a.txt", "a.json/b", "a.")] == [
        True, True, False, False, False]  # fmt: skip
    assert _nccl_json.claim("out.txt") == (
        None,
        "# skipping json output; out.txt does not end in .json",
    )
    Path("run.json").write_text("theirs")
    taken = [_nccl_json.claim("run.json") for _ in range(2)]
    assert taken == [("run.json.0", "# Writing JSON output to run.json.0"),
                     ("run.json.1", "# Writing JSON output to run.json.1")]  # fmt: skip
    assert Path("run.json").read_text() == "theirs"
    assert _nccl_json.claim("no/such/dir/run.json") == (
        None, "# skipping json output; no/such/dir/run.json not accessible")  # fmt: skip


# How two parsers written for nccl-tests read a row (their logic, restated): Microsoft
# superbench's nccl-bw takes the out-of-place busbw as the 6th token from the end; AWS's
# nccl_to_csv.py matches 13 columns from the start, N/A allowed only in the #wrong columns,
# and only nccl-tests' float, double, int, half types and sum..none ops.
_AWS_ROW = re.compile(
    r"^\s*(\d+)\s+(\d+)\s+(float|double|int|half)\s+(sum|prod|max|min|none)\s+(-?\d+)"
    + r"\s+(\d+\.?\d*)\s+(\d+\.?\d*)\s+(\d+\.?\d*)\s+(\d+|N/A)" * 2
)


@pytest.mark.parametrize("program", [p for p in RUNS if p != "hypercube_perf"])
def test_parsers_written_for_nccl_tests_read_every_row(two_ranks, program):
    tmp, outputs = two_ranks
    doc = json.loads((tmp / f"{program}.json").read_text())
    rows = [line for line in outputs[program] if line and not line.startswith("#")]
    assert len(rows) == len(doc["results"])
    for line, result in zip(rows, doc["results"]):
        assert float(line.split()[-6]) == float(get_float_str(result["out_of_place"]["bus_bw"], 6))
        # rows nccl-tests itself prints with other types or ops (avg) are not the parser's
        if result["type"] in ("float", "double", "half") and result["redop"] != "avg":
            match = _AWS_ROW.match(line)
            assert match is not None, line
            assert int(match.group(1)) == result["size"] and match.group(4) == result["redop"]
