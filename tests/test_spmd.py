"""Every module in tests/spmd, run SPMD under mpiexec at each world size it declares.

A module declares ``WORLD_SIZES = (1, 2, ...)`` (default (1, 2)) and optionally
``SPMD_TIMEOUT`` seconds for its tests (default 240), and ``SPMD_ALONE = True`` to run in a
launch of its own. The others run several to a launch (``COLLECTIVES_TEST_SPMD_BATCH``
modules of one world size, default 12; 1: a launch each), since every launch pays the
launcher's, Python's and pytest's start-up (seconds a launch, most of all under Open MPI);
each module still passes or fails on its own outcomes.

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

from tests.spmd_launcher import SpmdResult, run_spmd

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


BATCH = max(1, int(os.environ.get("COLLECTIVES_TEST_SPMD_BATCH", "12")))
_LAUNCHED: dict[tuple[Path, int], SpmdResult] = {}


def _batch(request, path: Path, size: int) -> list[tuple[Path, float]]:
    """The modules launched with ``path`` at ``size``: consecutive selected cases of that
    size, ``BATCH`` at most, never one that declares ``SPMD_ALONE``."""
    if BATCH == 1 or _declared(path, "SPMD_ALONE", False):
        return [(path, _launch_timeout(_declared(path, "SPMD_TIMEOUT", 240)))]
    chosen = []
    for item in request.session.items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if getattr(item, "originalname", None) != "test_spmd" or params.get("size") != size:
            continue
        if not _declared(params["path"], "SPMD_ALONE", False):
            chosen.append((params["path"], params["timeout"]))
    for start in range(0, len(chosen), BATCH):
        batch = chosen[start : start + BATCH]
        if any(p == path for p, _ in batch):
            return batch
    return [(path, _launch_timeout(_declared(path, "SPMD_TIMEOUT", 240)))]


def _own(result: SpmdResult, path: Path) -> SpmdResult:
    """``result`` of a launch of several modules, with only ``path``'s outcomes."""
    prefix = f"{path.relative_to(SPMD_DIR.parent.parent).as_posix()}::"
    ranks = {
        r: [o for o in outs if o["nodeid"].startswith(prefix)] for r, outs in result.ranks.items()
    }
    return SpmdResult(result.size, result.returncode, result.output, ranks)


@pytest.mark.parametrize("path,size,timeout", list(_cases()))
def test_spmd(path: Path, size: int, timeout: float, request):
    if (path, size) not in _LAUNCHED:
        batch = _batch(request, path, size)
        paths = [p for p, _ in batch]
        result = run_spmd(
            paths[0], size, timeout=sum(t for _, t in batch), pytest_args=tuple(map(str, paths[1:]))
        )
        for p in paths:
            _LAUNCHED[(p, size)] = result
    _passes(path, size, _own(_LAUNCHED.pop((path, size)), path), request)


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
