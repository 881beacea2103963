"""The documentation stays what a reader can trust: its code runs, the README stays short,
measurements stay summaries, and the three packages carry one version.

Code blocks of README.md and docs/*.md run when the line right before their opening fence
is an HTML comment (invisible on GitHub and in the Sphinx site):

- ``<!-- run -->``: run in this process at one rank (in a temporary working directory);
- ``<!-- run: ranks=N -->``: run as a script under ``mpiexec -n N``, through the suite's
  launcher environment (``tests/spmd_launcher.py``), killed past a time limit.

A block without the comment is a sketch (free names, a cluster's command line) and is not
run. docs/testing.md says the same for writers.
"""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.spmd_launcher import launcher_options, mpi_env, mpiexec

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
README_LIMIT = 8 * 1024  # bytes: a README read in one sitting, as mpi4py's and CuPy's are
LAUNCH_TIMEOUT = 120.0  # seconds for one multi-rank block, start-up included

_MARKED = re.compile(
    r"^<!-- run(?:: ranks=(?P<ranks>\d+))? -->\n```(?P<lang>\w*)\n(?P<code>.*?)^```$", re.M | re.S
)


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    ranks: int | None  # None: in this process
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(REPO)}:{self.line}"


def _blocks() -> list[Block]:
    found = []
    for page in PAGES:
        text = page.read_text()
        for m in _MARKED.finditer(text):
            assert m["lang"] == "python", f"{page.name}: a run marker before a {m['lang']!r} block"
            line = text.count("\n", 0, m.start()) + 2  # the opening fence's line, 1-based
            ranks = int(m["ranks"]) if m["ranks"] else None
            found.append(Block(page, line, ranks, m["code"]))
    return found


BLOCKS = _blocks()


def test_every_run_marker_is_followed_by_its_block():
    """A marker that the pattern misses (a blank line after it, a typo) would silently stop
    its block from running."""
    for page in PAGES:
        markers = len(re.findall(r"^<!-- run\b", page.read_text(), re.M))
        ours = sum(b.page == page for b in BLOCKS)
        assert markers == ours, f"{page.name}: {markers} run markers, {ours} blocks found after one"
    assert {b.page.name for b in BLOCKS} >= {"README.md", "getting_started.md"}


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.ranks is None], ids=lambda b: b.name)
def test_single_rank_block_runs(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # whatever a block writes lands here
    exec(compile(block.code, block.name, "exec"), {"__name__": "__main__"})


@pytest.mark.parametrize("block", [b for b in BLOCKS if b.ranks is not None], ids=lambda b: b.name)
def test_multi_rank_block_runs(block, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(block.code)
    cmd = [mpiexec(), *launcher_options(), "-n", str(block.ranks), sys.executable, str(script)]
    with mpi_env({"PYTHONPATH": str(REPO)}) as env:
        try:
            done = subprocess.run(
                cmd, cwd=tmp_path, env=env, capture_output=True, text=True,
                timeout=LAUNCH_TIMEOUT, start_new_session=True,
            )  # fmt: skip
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"{block.name} at {block.ranks} ranks: killed after {e.timeout:.0f} s")
    assert done.returncode == 0, f"{block.name} at {block.ranks} ranks:\n{done.stdout}{done.stderr}"


def test_readme_is_short():
    size = len((REPO / "README.md").read_bytes())
    assert size <= README_LIMIT, (
        f"README.md is {size} bytes; at most {README_LIMIT}: move detail to docs/"
    )


def _tracked(folder: Path) -> list[str]:
    """Files git tracks under ``folder`` (relative to it); every file there outside a
    checkout (an sdist, say)."""
    try:
        out = subprocess.run(
            ["git", "ls-files", "-z", "--", str(folder)], cwd=REPO, capture_output=True,
            text=True, timeout=60, check=True,
        ).stdout  # fmt: skip
        return [str(Path(p).relative_to(folder.relative_to(REPO))) for p in out.split("\0") if p]
    except (OSError, subprocess.CalledProcessError):
        return [str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()]


#: a kept run: ``<machine>-<yyyy>-<mm>-<dd>-<what>/`` holding README.md and at most one JSON
_RUN = re.compile(r"[a-z0-9]+(?:-[a-z0-9]+)*-\d{4}-\d{2}-\d{2}-[a-z0-9][a-z0-9-]*")


def test_results_are_summaries_not_per_size_records():
    """How a per-size record is told: by where it sits. A kept run is one folder with its
    README.md (command, machine, versions, tables) and at most one ``results.json``; any
    other file (a JSON per size or per run, a log, a plot, a one-off script) is a record
    that belongs in git history, not in the tree."""
    results = REPO / "benchmarks" / "results"
    folders: dict[str, list[str]] = {}
    for rel in _tracked(results):
        parts = Path(rel).parts
        assert len(parts) == 2, f"benchmarks/results/{rel}: not inside a run's folder"
        folders.setdefault(parts[0], []).append(parts[1])
    assert folders, "no kept run under benchmarks/results"
    for folder, files in folders.items():
        assert _RUN.fullmatch(folder), f"{folder}: not <machine>-<date>-<what>"
        assert "README.md" in files, f"{folder}: no README.md"
        extra = sorted(set(files) - {"README.md", "results.json"})
        assert not extra, f"benchmarks/results/{folder}: per-size or one-off files {extra}"


def test_one_version_for_the_three_packages():
    import collectives
    import ddp
    import pipeline

    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" in project["project"]["dynamic"]
    source = project["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert source == "collectives._version.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?(?:\.dev\d+)?", collectives.__version__)
    assert ddp.__version__ == pipeline.__version__ == collectives.__version__
