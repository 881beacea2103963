"""Launch an SPMD pytest module under ``mpiexec -n N`` and gather every rank's outcomes."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from collectives._launch.launcher import find_launcher, launcher_environment
from collectives._launch.launcher import mpi_family as launcher_family

REPO = Path(__file__).resolve().parent.parent


def launcher_options() -> list[str]:
    """Options every suite launch gives ``mpiexec``, from ``COLLECTIVES_TEST_MPIEXEC_OPTIONS``
    (e.g. ``-launcher fork -hosts localhost``, where Hydra cannot resolve the host name)."""
    return shlex.split(os.environ.get("COLLECTIVES_TEST_MPIEXEC_OPTIONS", ""))


def mpiexec() -> str:
    """The ``mpiexec`` beside this Python (the ``mpich`` wheel puts it there), else on PATH."""
    return find_launcher()


def mpi_family(launcher: str | None = None) -> str:
    """``"mpich"``, ``"openmpi"`` or ``"impi"``: which MPI the launcher belongs to, read from
    ``mpiexec --version`` (as ``python -m collectives.run`` reads it)."""
    return _family(launcher or mpiexec())


_family = functools.cache(launcher_family)

# What each MPI needs to start a test job here: Open MPI refuses root (CI runs as root) and
# more ranks than cores (the suite runs up to 4 ranks, on 2 cores in CI) unless told; its
# libfabric transport (the `ofi` BTL) slept a second in every process's MPI_Init on machines
# with no fabric (`OMPI_MCA_btl_base_verbose`, strace), so it is left out (TCP and shared
# memory remain, across the emulated nodes too).
_NEEDS = {
    "openmpi": {
        "OMPI_ALLOW_RUN_AS_ROOT": "1",
        "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        "PRTE_MCA_rmaps_default_mapping_policy": ":oversubscribe",
        "OMPI_MCA_btl": "^ofi",
    },
}


def launch_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment, without another job's variables, plus what this MPI
    needs to start here, plus ``extra``."""
    # Without another job's variables (those of a test runner started inside a job, or of
    # this process, an MPI singleton once it imported collectives): settings are kept.
    env = launcher_environment(os.environ)
    env.update(_NEEDS.get(mpi_family(), {}))
    env.update(extra or {})
    return env


@contextlib.contextmanager
def mpi_env(extra: Mapping[str, str] | None = None) -> Iterator[dict[str, str]]:
    """The environment for an ``mpiexec`` started by a test, for as long as the job runs:
    this process's, without another job's variables, plus what this MPI needs to start here,
    plus ``TMPDIR``, a directory of this job's own that is removed after it, plus ``extra``.

    A launcher that a test kills leaves its session files behind (Open MPI: ``ompi.<pid>``
    in ``TMPDIR``); a later launcher given the same pid (pids wrap, at 32768 on many
    machines) finds them and cannot start ("The PMIx server's listener thread failed to
    start"). In a directory of its own, no job can meet another's leftovers."""
    tmpdir = tempfile.mkdtemp(prefix="mpijob-")
    try:
        yield launch_env({"TMPDIR": tmpdir, **(extra or {})})
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)


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
    with mpi_env({"PYTHONUNBUFFERED": "1", **(env or {})}) as run_env:
        report_dir = run_env["SPMD_REPORT_DIR"] = run_env["TMPDIR"]
        cmd = [
            mpiexec(),
            *launcher_options(),
            "-n",
            str(size),
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(target),
            *pytest_args,
        ]
        proc = subprocess.Popen(
            cmd,
            cwd=REPO,
            env=run_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
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
