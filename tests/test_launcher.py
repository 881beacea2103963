"""The tests' own launcher: a job that a test kills leaves nothing that stops a later job.

Open MPI's launcher keeps its session files in ``$TMPDIR/ompi.<pid>``; killed, it leaves them,
and a later launcher that is given the same pid (pids wrap) finds them and cannot start. Each
job started through ``mpi_env`` has a ``TMPDIR`` of its own, removed after it."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.spmd_launcher import REPO, mpi_env, mpi_family, mpiexec

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _kill_once_started(env: dict[str, str]) -> list[Path]:
    """Start a 1-rank job that sleeps, SIGKILL its whole session once its launcher has written
    its session files (Open MPI) or after 3 s (others); return what it left in its TMPDIR."""
    proc = subprocess.Popen([mpiexec(), "-n", "1", *SLEEPER], cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)  # fmt: skip
    tmpdir = Path(env["TMPDIR"])
    try:
        deadline = time.monotonic() + (60 if mpi_family() == "openmpi" else 3)
        while time.monotonic() < deadline and not list(tmpdir.glob("ompi.*/pmix.*")):
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    return sorted(tmpdir.iterdir())


def test_a_killed_jobs_leftovers_go_with_its_directory():
    with mpi_env() as env:
        left = _kill_once_started(env)
        tmpdir = Path(env["TMPDIR"])
        assert tmpdir.parent == Path(tempfile.gettempdir())
        if mpi_family() == "openmpi":
            assert left and all(p.name.startswith("ompi.") for p in left), left
    assert not tmpdir.exists()


@pytest.mark.skipif(mpi_family() != "openmpi", reason="Open MPI's session files")
def test_leftovers_of_a_killed_launcher_with_the_same_pid_stop_only_a_job_without_its_own_dir(
    tmp_path,
):
    with mpi_env() as env:
        (session,) = _kill_once_started(env)
        shutil.copytree(session, tmp_path / "stale", symlinks=True)
    # A launcher that got the killed one's pid: the shell puts the leftovers where that
    # launcher would find them, then becomes the launcher (exec keeps the pid).
    pid_file = tmp_path / "pid"
    script = 'echo $$ > "$1"; cp -a "$2" "$3/ompi.$$"; shift 3; exec "$@"'
    system_tmp = tempfile.gettempdir()
    argv = ["bash", "-c", script, "launcher", str(pid_file), str(tmp_path / "stale"), system_tmp,
            mpiexec(), "-n", "1", sys.executable, "-c", "print('started')"]  # fmt: skip
    outcomes = {}
    for own_dir in (False, True):
        with mpi_env() as env:
            if not own_dir:  # the TMPDIR this process has, if any
                del env["TMPDIR"]
                env.update({k: v for k, v in os.environ.items() if k == "TMPDIR"})
            try:
                proc = subprocess.run(argv, cwd=REPO, env=env, capture_output=True, text=True,
                                      timeout=120)  # fmt: skip
            finally:  # the leftovers put in the shared directory, unless the launcher took them
                shutil.rmtree(Path(system_tmp, f"ompi.{pid_file.read_text().strip()}"),
                              ignore_errors=True)  # fmt: skip
        outcomes[own_dir] = (proc.returncode, proc.stdout + proc.stderr)
    returncode, output = outcomes[False]
    assert returncode != 0 and "listener thread failed to start" in output, output
    returncode, output = outcomes[True]
    assert returncode == 0 and "started" in output, output
