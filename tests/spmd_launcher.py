"""Launch an SPMD pytest module under ``mpiexec -n N`` and gather every rank's outcomes."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def mpiexec() -> str:
    """The ``mpiexec`` beside this Python (the ``mpich`` wheel puts it there), else on PATH."""
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise RuntimeError("no mpiexec found: pip install mpich (or the test extra)")
    return found


@dataclass
class SpmdResult:
    size: int
    returncode: int | None
    output: str
    ranks: dict[int, list[dict]] = field(default_factory=dict)

    def failures(self) -> list[str]:
        """One readable paragraph per failing (test, rank), plus missing ranks."""
        lines = []
        for rank in range(self.size):
            if rank not in self.ranks:
                lines.append(f"rank {rank}: wrote no report (crashed or killed)")
                continue
            for o in self.ranks[rank]:
                if o["outcome"] == "failed":
                    lines.append(f"rank {rank}: {o['nodeid']} [{o['when']}]\n{o['detail']}")
        return lines

    def counts(self, rank: int = 0) -> dict[str, int]:
        out: dict[str, int] = {}
        for o in self.ranks.get(rank, []):
            if o["when"] == "call" or o["outcome"] != "passed":
                out[o["outcome"]] = out.get(o["outcome"], 0) + 1
        return out


def run_spmd(
    target: str | Path,
    size: int,
    *,
    timeout: float = 300.0,
    env: dict[str, str] | None = None,
    pytest_args: tuple[str, ...] = (),
) -> SpmdResult:
    """Run ``pytest target`` on ``size`` ranks; kill the whole job past ``timeout`` seconds."""
    with tempfile.TemporaryDirectory() as report_dir:
        run_env = dict(os.environ, SPMD_REPORT_DIR=report_dir, PYTHONUNBUFFERED="1")
        run_env.update(env or {})
        cmd = [mpiexec(), "-n", str(size), sys.executable, "-m", "pytest", "-q", "-p",
               "no:cacheprovider", str(target), *pytest_args]
        proc = subprocess.Popen(cmd, cwd=REPO, env=run_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
            returncode: int | None = proc.returncode
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            output, _ = proc.communicate()
            output += f"\n[killed after {timeout:.0f} s]"
            returncode = None
        result = SpmdResult(size, returncode, output)
        for rank in range(size):
            path = Path(report_dir, f"rank{rank}.json")
            if path.exists():
                result.ranks[rank] = json.loads(path.read_text())["outcomes"]
        return result
