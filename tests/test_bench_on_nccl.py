"""Every nccl-tests program on the NCCL backend against raw ``cupy.cuda.nccl`` (the emulated
CuPy where no GPU is: the Python path, not the GPU), on 2 ranks: it runs, checks every
result, and times the baseline beside ours. Run by the NCCL pass of ``.ci/run``
(``COLLECTIVES_TEST_BACKEND=nccl``)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.emulated_gpu import nccl_job_env
from tests.spmd_launcher import REPO, mpi_env, mpiexec

PROGRAMS = ["all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "alltoall",
            "gather", "scatter", "sendrecv", "hypercube"]  # fmt: skip

pytestmark = pytest.mark.skipif(
    os.environ.get("COLLECTIVES_TEST_BACKEND") != "nccl",
    reason="the NCCL pass runs it (COLLECTIVES_TEST_BACKEND=nccl)",
)


@pytest.mark.parametrize("program", PROGRAMS)
def test_program_runs_on_nccl_against_raw_nccl(program):
    argv = ["-b", "8", "-e", "64", "-f", "4", "-n", "2", "-w", "1", "-c", "1",
            "--backend", "nccl", "--baseline", "nccl"]  # fmt: skip
    with mpi_env(nccl_job_env(gpus=2)) as env:
        proc = subprocess.run(
            [mpiexec(), "-n", "2", sys.executable, "-m", f"benchmarks.{program}_perf", *argv],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Traceback" not in output, output
    assert "# Out of bounds values : 0 OK" in proc.stdout, output
    summary = [line for line in proc.stdout.splitlines() if line.startswith("# Summary:")]
    assert len(summary) == 1 and "0 wrong" in summary[0], output
    if program != "hypercube":  # raw NCCL has no hypercube: nothing to time it against
        assert "the time of nccl" in summary[0], summary
