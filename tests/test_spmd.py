"""Every module in tests/spmd, run SPMD under mpiexec at each world size it declares.

A module declares ``WORLD_SIZES = (1, 2, ...)`` (default (1, 2)) and optionally
``SPMD_TIMEOUT`` seconds for the whole launch (default 240).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.spmd_launcher import run_spmd

SPMD_DIR = Path(__file__).resolve().parent / "spmd"


def _declared(path: Path, name: str, default):
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == name for t in node.targets
        ):
            return ast.literal_eval(node.value)
    return default


def _cases():
    for path in sorted(SPMD_DIR.glob("test_*.py")):
        timeout = _declared(path, "SPMD_TIMEOUT", 240)
        for size in _declared(path, "WORLD_SIZES", (1, 2)):
            yield pytest.param(path, size, timeout, id=f"{path.stem}-np{size}")


@pytest.mark.parametrize("path,size,timeout", list(_cases()))
def test_spmd(path: Path, size: int, timeout: float):
    _passes(path, size, run_spmd(path, size, timeout=timeout))


@pytest.mark.parametrize(
    "path,size",
    [
        (SPMD_DIR / "test_collectives_verbs.py", 2),
        (SPMD_DIR / "test_reliability.py", 2),
    ],
    ids=lambda value: value.stem if isinstance(value, Path) else f"np{value}",
)
def test_spmd_with_the_direct_path_in_python(path: Path, size: int):
    # as where collectives._fastmpi did not build: the modules that use the direct path most
    # (test_collectives_direct.py runs the in-process ones so)
    env = {"COLLECTIVES_PURE_PYTHON": "1"}
    _passes(path, size, run_spmd(path, size, timeout=240, env=env))


def _passes(path: Path, size: int, result) -> None:
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
        reasons = {o["detail"] for o in result.ranks[0] if o["outcome"] == "skipped"}
        pytest.skip("; ".join(sorted(reasons)))
    assert counts.get("passed", 0) > 0, f"no test passed:\n{result.output[-2000:]}"
