"""benchmarks.collective run for real under mpiexec at tiny sizes; its JSON checked.

Every op runs on 2 and 3 ranks in one launch per world size (a driver calls ``main`` once
per op), and the command line itself runs once with ``--baseline mpi4py`` and ``--plot``.
Checked: every row's result was verified (#wrong 0) for every form the op has, the sizes
and counts are nccl-tests', and algbw/busbw follow the formulas written out here by hand.
No timing is asserted.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.spmd_launcher import REPO, mpi_env, mpiexec

OPS = ("all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "all_to_all",
       "gather", "scatter", "sendrecv")  # fmt: skip
PER_RANK = {"all_gather", "reduce_scatter", "all_to_all", "gather", "scatter"}
# sendrecv in place is timed and never checked, as nccl-tests
UNCHECKED_IN_PLACE = {"sendrecv"}
TIMEOUT = 180


def _factor(op: str, n: int) -> float:
    if op == "all_reduce":
        return 2 * (n - 1) / n
    return (n - 1) / n if op in PER_RANK else 1.0


def _launch(
    n: int, argv: list[str], tmp_path: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    try:
        with mpi_env(env) as job_env:
            proc = subprocess.run(
                [mpiexec(), "-n", str(n), sys.executable, *argv],
                cwd=REPO, env=job_env, capture_output=True, text=True, timeout=TIMEOUT,
            )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"benchmark hung on {n} ranks (killed after {TIMEOUT} s): {exc.output}")
    assert proc.returncode == 0, (
        f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    )
    return proc


def _check_report(path: Path, op: str, n: int, dtype: str, sizes: list[int], redop: str = "sum"):
    report = json.loads(path.read_text())
    meta, rows = report["metadata"], report["rows"]
    assert (meta["op"], meta["backend"], meta["world_size"]) == (op, "mpi", n)
    assert meta["versions"]["mpi4py"] and meta["host"] and meta["date"]
    itemsize = {"float32": 4, "int8": 1, "float16": 2, "int32": 4}[dtype]
    nccl_name = {"float32": "float", "float16": "half"}.get(dtype, dtype)  # the type column
    assert [row["size"] for row in rows] == sizes
    for row in rows:
        total = row["size"] // itemsize
        # per rank: whole 16-byte blocks, as nccl-tests (96 B of int8 at 3 ranks: 32 -> 32)
        blocks = (total // n) & ~(16 // itemsize - 1)
        assert row["count"] == (blocks if op in PER_RANK else total)
        assert row["type"] == nccl_name
        reducing = op in ("all_reduce", "reduce", "reduce_scatter", "sendrecv")
        assert row["redop"] == (redop if reducing else "none")
        for placement in ("out_of_place", "in_place"):
            cell = row[placement]
            if placement == "in_place" and op in UNCHECKED_IN_PLACE:
                assert cell["wrong"] is None
            else:
                assert cell["wrong"] == 0, (
                    f"{op} {placement} at {row['size']} B: {cell['wrong']} wrong"
                )
            nbytes = row["count"] * itemsize * (n if op in PER_RANK else 1)
            if nbytes == 0:
                continue
            assert cell["time_us"] > 0
            assert cell["algbw"] == pytest.approx(nbytes / 1e9 / (cell["time_us"] * 1e-6))
            assert cell["busbw"] == pytest.approx(cell["algbw"] * _factor(op, n))
    assert report["summary"]["wrong"] == 0 and report["complete"] is True
    return report


DRIVER = """
import sys
from benchmarks.collective import main
out, dtype, redop = sys.argv[1:4]
for op in sys.argv[4:]:
    rc = main(["--op", op, "-b", "96", "-e", "1536", "-f", "4", "-n", "2", "-w", "1",
               "-d", dtype, "-o", redop, "-r", "1", "--json", f"{out}/{op}.json"])
    assert rc == 0, (op, rc)
"""


@pytest.mark.parametrize("n,dtype,redop", [(2, "float32", "sum"), (3, "int8", "max")])
def test_every_op(tmp_path, n, dtype, redop):
    _launch(n, ["-c", DRIVER, str(tmp_path), dtype, redop, *OPS], tmp_path)
    for op in OPS:
        _check_report(tmp_path / f"{op}.json", op, n, dtype, [96, 384, 1536], redop)


def test_hierarchical_algorithm_on_2_nodes_of_2_ranks(tmp_path):
    ops = ("all_reduce", "reduce_scatter", "all_gather")
    driver = DRIVER.replace(
        '"--json"', '"--algorithm", "hierarchical", "--baseline", "flat", "--rounds", "1", "--json"'
    )
    proc = _launch(4, ["-c", driver, str(tmp_path), "int32", "sum", *ops], tmp_path,
                   env={"COLLECTIVES_RANKS_PER_NODE": "2"})  # fmt: skip
    assert proc.stdout.count("hierarchical over 2 nodes of 2 ranks") == len(ops)
    for op in ops:
        # 96 B of int32 at 4 ranks: 6 per rank, 4 in whole 16-byte blocks (64 B)
        first = 96 if op == "all_reduce" else 64
        report = _check_report(tmp_path / f"{op}.json", op, 4, "int32", [first, 384, 1536])
        assert report["summary"]["baseline"] == "flat" and report["summary"]["baseline_wrong"] == 0


def test_command_line_with_baseline_and_plot(tmp_path):
    out, png = tmp_path / "allreduce.json", tmp_path / "allreduce.png"
    proc = _launch(
        2,
        ["-m", "benchmarks.collective", "--op", "all_reduce", "-b", "8", "-e", "32K", "-f", "16",
         "-n", "3", "-w", "1", "--rounds", "2", "-d", "float16", "--baseline", "mpi4py",
         "--json", str(out), "--plot", str(png)],
        tmp_path,
    )  # fmt: skip
    assert "# Avg bus bandwidth" in proc.stdout and "Out of bounds values : 0 OK" in proc.stdout
    report = _check_report(out, "all_reduce", 2, "float16", [8, 128, 2048, 32768])
    assert report["metadata"]["baseline"] == "mpi4py" and report["metadata"]["rounds"] == 2
    for row in report["rows"]:
        for placement in ("out_of_place", "in_place"):
            base = row["baseline"][placement]
            assert base["wrong"] == 0
            assert row["ratio"][placement] == pytest.approx(
                row[placement]["time_us"] / base["time_us"]
            )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5000


@pytest.mark.parametrize(
    "argv,message",
    [(["--op", "reduce", "-r", "3"], "root (-r) must be in [0, 1), got 3"),
     (["--baseline", "nccl"], "--baseline nccl runs on CuPy arrays, expected --backend nccl"),
     (["-e", "4", "-b", "8"], "max_bytes (-e) must be >= min_bytes (-b) = 8, got 4")],
)  # fmt: skip
def test_bad_flag_fails_cleanly(argv, message):
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.collective", "-b", "8", "-e", "8", *argv],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert proc.returncode == (1 if "--baseline" in argv else 2)
    assert message in proc.stderr


@pytest.mark.skipif(importlib.util.find_spec("torch") is not None, reason="torch is installed")
def test_missing_baseline_library_is_named():
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.collective", "-b", "8", "-e", "8", "--baseline", "torch"],
        cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "BackendUnavailableError: benchmark: --baseline torch needs torch" in proc.stderr


def test_every_op_async_against_mpi4py_i_verbs(tmp_path):
    """``--async``: ours with ``async_op=True`` and ``wait()``, mpi4py with its I-verbs and
    ``Wait``; every result of both checked, on 2 ranks."""
    driver = DRIVER.replace(
        '"--json"', '"--async", "--baseline", "mpi4py", "--rounds", "1", "--json"'
    )
    proc = _launch(2, ["-c", driver, str(tmp_path), "float32", "sum", *OPS], tmp_path)
    assert proc.stdout.count("baseline: mpi4py async: async_op=True and wait()") == len(OPS)
    for op in OPS:
        report = _check_report(tmp_path / f"{op}.json", op, 2, "float32", [96, 384, 1536])
        assert report["metadata"]["async"] is True and report["metadata"]["baseline"] == "mpi4py"
        assert report["summary"]["baseline_wrong"] == 0
        compared = [
            (row["baseline"][p], row["ratio"][p])
            for row in report["rows"]
            for p in ("out_of_place", "in_place")
            if row["baseline"][p] is not None
        ]
        # mpi4py has every op but an out-of-place broadcast and an in-place sendrecv
        assert len(compared) == (3 if op in ("broadcast", "sendrecv") else 6), op
        for base, ratio in compared:
            assert base["wrong"] == 0 and base["time_us"] > 0 and ratio > 0


@pytest.mark.parametrize("asynchronous", [False, True])
def test_every_op_against_torch(tmp_path, asynchronous):
    """``--baseline torch``: torch.distributed's calls (gloo here), with ``--async``
    ``async_op=True`` and ``wait()``; every result of both checked, on 2 ranks."""
    pytest.importorskip("torch.distributed")
    flags = '"--async", ' if asynchronous else ""
    driver = DRIVER.replace('"--json"', flags + '"--baseline", "torch", "--rounds", "1", "--json"')
    proc = _launch(2, ["-c", driver, str(tmp_path), "float32", "sum", *OPS], tmp_path)
    assert proc.stdout.count("async: async_op=True and wait()") == len(OPS) * asynchronous
    for op in OPS:
        report = _check_report(tmp_path / f"{op}.json", op, 2, "float32", [96, 384, 1536])
        assert report["metadata"]["async"] is asynchronous
        assert report["metadata"]["baseline"] == "torch"
        assert report["summary"]["baseline_wrong"] == 0
        compared = [
            row["baseline"][p]
            for row in report["rows"]
            for p in ("out_of_place", "in_place")
            if row["baseline"][p] is not None
        ]
        # torch has both forms of all_gather and reduce_scatter, only the in-place one of
        # all_reduce, reduce and broadcast, and only the out-of-place one of the rest
        assert len(compared) == (6 if op in ("all_gather", "reduce_scatter") else 3), op
        assert all(base["wrong"] == 0 and base["time_us"] > 0 for base in compared), op


@pytest.mark.parametrize(
    "argv,message",
    [(["--async", "--baseline", "cupyx"],
      "torch (async_op=True) or flat only, got --baseline cupyx"),
     (["--async", "--op", "hypercube"], "--async does not apply to hypercube")],
)  # fmt: skip
def test_async_with_a_baseline_or_op_it_has_no_form_for_is_a_usage_error(argv, message, capsys):
    from benchmarks.collective import parse_args

    with pytest.raises(SystemExit) as exit_:
        parse_args(["-b", "8", "-e", "8", *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err
    assert parse_args(["-b", "8", "-e", "8"]).async_op is False
