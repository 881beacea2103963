""".ci/gpu where there is no GPU: it says so and succeeds, creating nothing."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.spmd_launcher import REPO

# A lent GPU machine runs MPICH's wheel: its plan is rehearsed under MPICH.
pytestmark = pytest.mark.mpi_independent

SCRIPT = REPO / ".ci" / "gpu"
LEASE = REPO / ".ci" / "gpu_lease"  # .ci/gpu on a lent machine, with the carried NCCL


def _gpu_here() -> bool:
    try:
        import cupy

        if cupy.cuda.runtime.getDeviceCount() > 0:
            return True
    except Exception:
        pass
    if shutil.which("nvidia-smi") is None:
        return False
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True)
    return "GPU" in listed.stdout


@pytest.mark.parametrize("script", [SCRIPT, LEASE])
def test_ci_gpu_is_an_executable_bash_script(script):
    assert os.access(script, os.X_OK)
    assert script.read_text().startswith("#!/usr/bin/env bash\n")
    syntax = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert syntax.returncode == 0, syntax.stderr


def test_ci_gpu_without_a_gpu_runs_nothing_and_exits_0(tmp_path):
    if _gpu_here():
        pytest.skip("a GPU is here: .ci/gpu would run everything; run it directly")
    out = tmp_path / "out"
    proc = subprocess.run(
        [str(SCRIPT), str(out)],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout == "no CUDA device: nothing to run\n", proc.stdout + proc.stderr
    assert not out.exists()


def test_the_lease_command_without_a_gpu_says_what_it_loads_and_runs_ci_gpu(tmp_path):
    if _gpu_here():
        pytest.skip("a GPU is here: the lease command would run the proof; run it directly")
    if (REPO / ".nccl").exists():
        pytest.skip(".nccl/ is here: the lease command would try to load it")
    out = tmp_path / "out"
    proc = subprocess.run(
        [str(LEASE), str(out), "proof"],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[1:] == [
        "# NCCL: nothing carried in .nccl/: the image's own",
        "no CUDA device: nothing to run",
    ], proc.stdout
    usage = subprocess.run([str(LEASE), str(out)], capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2 and "usage: .ci/gpu_lease OUTDIR STEPS" in usage.stderr


def test_ci_gpu_wants_one_outdir():
    proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "usage: .ci/gpu OUTDIR" in proc.stderr


def _gpu_tools():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_tools", REPO / ".ci" / "gpu_tools.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ci_gpu(*args: str, env: dict | None = None, timeout: float = 300):
    return subprocess.run(
        [str(SCRIPT), *args],
        env={**os.environ, "PYTHON": sys.executable, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_list_gives_every_step_a_group_and_a_budget_and_one_lease_fits_its_15_minutes():
    proc = _ci_gpu("--list")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    steps = [line.split() for line in lines[1:] if line and not line.startswith((" ", "(", "one"))]
    assert len(steps) == 16 and {s[1] for s in steps} == {"proof", "more"}
    totals = {}
    for group in ("proof", "more"):
        total = next(line for line in lines if line.split()[:1] == [group])
        totals[group] = int(total.split()[1].rstrip("s"))
        listed = sum(int(s[2].rstrip("s")) for s in steps if s[1] == group)
        assert totals[group] == 45 + listed, total  # the set-up's 45 s and the steps'
    # a lease is 15 minutes of device time: its start and one command of at most ~8.5
    # minutes (timeout_s 540), with time to spare for the transfers and a rerun
    assert totals["proof"] <= 520 and totals["more"] <= 520, totals
    lease = int(lines[-1].split("at most ")[1].split()[0])
    assert lease == 90 + totals["proof"] <= 10 * 60, lines[-1]
    # the most telling first: the backend's own modules at 2 ranks, then the layers
    proof = [s[0] for s in steps if s[1] == "proof"]
    assert proof[:3] == ["nccl-verbs-2", "layers-nccl-2", "gpt-nccl-2"], proof


def test_an_unknown_step_is_a_usage_error(tmp_path):
    proc = _ci_gpu(str(tmp_path / "out"), "--steps", "sweep-nccl-2,no-such-step", "--rehearse")
    assert proc.returncode == 2
    assert "no step or group named 'no-such-step'" in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_rehearsed_step_leaves_its_results_and_files(tmp_path):
    out = tmp_path / "out"
    proc = _ci_gpu(str(out), "--steps", "sweep-nccl-2,gpt-nccl-2,latency-nccl-1", "--rehearse")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = json.loads((out / "results.json").read_text())
    assert [(s["step"], s["status"]) for s in results["steps"]] == [
        ("set-up", "passed"),
        ("gpt-nccl-2", "passed"),  # in the order of .ci/gpu --list
        ("sweep-nccl-2", "passed"),
        ("latency-nccl-1", "passed"),
    ]
    assert [s["budget_s"] for s in results["steps"][1:]] == [60, 50, 25]
    rows = results["sweep-nccl-2"]["rows"]
    assert rows and all(row["in_place"]["wrong"] == 0 for row in rows)
    assert set(results["latency-nccl-1"]) == {"sync", "async"}
    # the emulated NCCL reduces in rank order on every rank: the MPI backend's losses on
    # each 2-rank mesh (tensor, pipeline, data parallel)
    assert proc.stdout.count("largest relative difference between nccl and mpi: ") == 3
    assert "out-of-place" not in proc.stdout or "0 wrong" in proc.stdout
    assert "init + close on nccl, 2 rank(s), 10 times" in proc.stdout
    assert sorted(p.name for p in out.iterdir()) == ["gpu.log", "results.json", "sweep-nccl-2.png"]
    assert "every file can come back" in proc.stdout


def test_steps_past_the_deadline_do_not_run_and_fail_the_run(tmp_path):
    out = tmp_path / "out"
    proc = _ci_gpu(str(out), "--steps", "ddp-nccl-2", "--rehearse", env={"GPU_DEADLINE_S": "0"})
    assert proc.returncode == 1
    results = json.loads((out / "results.json").read_text())
    assert results["steps"][-1]["status"] == "not run (deadline)"


def test_what_a_lent_machine_cannot_send_back_is_named(tmp_path):
    tools = _gpu_tools()
    for i in range(8):
        (tmp_path / f"f{i}.txt").write_text("x")
    assert tools.outdir_problems(str(tmp_path)) == []
    (tmp_path / "a" / "b" / "c").mkdir(parents=True)
    (tmp_path / "a" / "b" / "c" / "deep.txt").write_text("x")
    (tmp_path / "a" / "bad name.txt").write_bytes(b"\0" * (16 * 2**20))
    problems = "\n".join(tools.outdir_problems(str(tmp_path)))
    assert "more than 2 folders below" in problems and "deep.txt" in problems
    assert "bad name.txt: a name of other than letters" in problems
    assert "not under 16 MiB" in problems
    assert "10 files, more than 8" in problems
