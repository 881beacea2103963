"""The examples on the NCCL backend print what they print on the MPI backend.

Each example runs twice under ``mpiexec``, with ``--backend mpi`` and ``--backend nccl`` (the
quickstart, which takes no options, by ``COLLECTIVES_BACKEND``, what ``init()``'s default
``"auto"`` then takes), on the
real CuPy where one is installed, else on the emulated one (tests/emulation: it proves the
Python path, not the GPU); the numbers they print (losses, accuracies, results) must agree.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.emulated_gpu import nccl_job_env
from tests.spmd_launcher import REPO, mpi_env, mpiexec

pytestmark = pytest.mark.skipif(
    os.environ.get("COLLECTIVES_TEST_BACKEND") != "nccl",
    reason="the NCCL pass runs it (COLLECTIVES_TEST_BACKEND=nccl)",
)

NUMBER = re.compile(r"-?\d+\.\d+(?:e[-+]\d+)?|-?\d+")

#: (example, ranks, arguments, relative tolerance of the printed numbers)
EXAMPLES = [
    ("quickstart.py", 4, [], 0.0),
    ("ddp_mlp.py", 2, ["--epochs", "2"], 1e-5),  # float32, printed to 6 digits
    ("tp_mesh.py", 4, ["--steps", "4"], 1e-9),
    ("pipeline_mlp.py", 4, ["--dp", "2", "--steps", "6"], 1e-9),
    ("gpt_3d.py", 8, ["--dp", "2", "--tp", "2", "--pp", "2", "--steps", "3"], 1e-9),
]


def run_example(name: str, ranks: int, args: list[str], backend: str) -> str:
    """rank 0's output of ``examples/name args`` on ``ranks`` ranks of ``backend``."""
    extra = {**nccl_job_env(gpus=ranks), "COLLECTIVES_BACKEND": backend}
    with mpi_env(extra) as env:
        proc = subprocess.run(
            [mpiexec(), "-n", str(ranks), sys.executable, str(REPO / "examples" / name),
             *args, *([] if name == "quickstart.py" else ["--backend", backend])],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert proc.returncode == 0, f"{name} on {backend}:\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def numbers(output: str) -> list[float]:
    """Every number printed, but timings (``ms``) and the backend's name."""
    lines = [re.sub(r"\d+(\.\d+)? ms", "", line) for line in output.splitlines()]
    return [float(n) for line in lines for n in NUMBER.findall(line)]


@pytest.mark.parametrize("name,ranks,args,rel", EXAMPLES, ids=[e[0] for e in EXAMPLES])
def test_example_prints_the_same_numbers_on_nccl_as_on_mpi(name, ranks, args, rel):
    on_mpi = run_example(name, ranks, args, "mpi")
    on_nccl = run_example(name, ranks, args, "nccl")
    assert "nccl" not in on_mpi and ("nccl" in on_nccl or "backend" not in on_mpi), on_nccl
    expected, got = numbers(on_mpi), numbers(on_nccl)
    assert len(expected) > 0 and len(got) == len(expected), (on_mpi, on_nccl)
    assert got == pytest.approx(expected, rel=rel, abs=1e-12), (on_mpi, on_nccl)
