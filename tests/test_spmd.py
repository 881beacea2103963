"""Every module in tests/spmd, run SPMD under mpiexec at each world size it declares.

A module declares ``WORLD_SIZES = (1, 2, ...)`` (default (1, 2)) and optionally
``SPMD_TIMEOUT`` seconds for the whole launch (default 240).

``COLLECTIVES_TEST_BACKEND`` (``mpi``, ``mpi-cupy`` or ``nccl``; see tests/spmd/conftest.py)
passes through to every rank. ``COLLECTIVES_TEST_WORLD_SIZES=1,2`` keeps only the launches
at those world sizes; ``COLLECTIVES_TEST_SPMD_TIMEOUT=S`` caps each launch at S seconds. Inner tests that skip are counted per launch and summed up, with their
reasons, at the end of the run (tests/conftest.py), even where others passed.
"""

from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

from tests.spmd_launcher import run_spmd

SPMD_DIR = Path(__file__).resolve().parent / "spmd"
TEST_BACKEND = os.environ.get("COLLECTIVES_TEST_BACKEND", "mpi")


def _declared(path: Path, name: str, default):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return default


def _chosen_sizes() -> set[int] | None:
    text = os.environ.get("COLLECTIVES_TEST_WORLD_SIZES", "").strip()
    return {int(s) for s in text.split(",") if s.strip()} if text else None


def _launch_timeout(declared: float) -> float:
    cap = os.environ.get("COLLECTIVES_TEST_SPMD_TIMEOUT")
    return min(declared, float(cap)) if cap else declared


def _cases():
    chosen = _chosen_sizes()
    for path in sorted(SPMD_DIR.glob("test_*.py")):
        timeout = _launch_timeout(_declared(path, "SPMD_TIMEOUT", 240))
        for size in _declared(path, "WORLD_SIZES", (1, 2)):
            if chosen is None or size in chosen:
                yield pytest.param(path, size, timeout, id=f"{path.stem}-np{size}")


@pytest.mark.parametrize("path,size,timeout", list(_cases()))
def test_spmd(path: Path, size: int, timeout: float, request):
    _passes(path, size, run_spmd(path, size, timeout=timeout), request)


def _passes(path: Path, size: int, result, request) -> None:
    skipped = [o for o in result.ranks.get(0, []) if o["outcome"] == "skipped"]
    # read by tests/conftest.py's summary of inner outcomes
    request.node.user_properties.append(
        (
            "spmd",
            {
                "launch": f"{path.stem}-np{size}",
                "counts": result.counts(0),
                "skipped": [o["detail"] for o in skipped],
            },
        )
    )
    problems = result.failures()
    if result.returncode is None:
        problems.append("job hung and was killed")
    elif result.returncode not in (0, 5) and not problems:
        problems.append(f"mpiexec exited {result.returncode}")
    if problems:
        pytest.fail(
            f"{path.name} on {size} ranks:\n"
            + "\n\n".join(problems)
            + "\n--- job output (tail) ---\n"
            + result.output[-4000:],
            pytrace=False,
        )
    counts = result.counts(0)
    if counts.get("passed", 0) == 0 and counts.get("skipped", 0) > 0:
        pytest.skip("; ".join(sorted({o["detail"] for o in skipped})))
    assert counts.get("passed", 0) > 0, f"no test passed:\n{result.output[-2000:]}"
