""".ci/gpu where there is no GPU: it says so and succeeds, creating nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

from tests.spmd_launcher import REPO

SCRIPT = REPO / ".ci" / "gpu"


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


def test_ci_gpu_is_an_executable_bash_script():
    assert os.access(SCRIPT, os.X_OK)
    assert SCRIPT.read_text().startswith("#!/usr/bin/env bash\n")
    syntax = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True)
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


def test_ci_gpu_wants_one_outdir():
    proc = subprocess.run([str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert "usage: .ci/gpu OUTDIR" in proc.stderr
