"""Importing collectives (and ddp, pipeline) makes no MPI call and installs no hook; the first
``init`` does both: its tables, and on a world of several ranks the hooks that end the job."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.spmd_launcher import REPO, mpi_env
from tests.test_reliability_jobs import _job

#: imports the packages with the MPI calls that could be made at import watched (each name
#: below, looked up on the module as the library does, is swapped for a recorder until the
#: imports are done), then prints what changed, before and after ``init``
IMPORTS = """
import atexit, json, os, sys
from mpi4py import MPI

made = []


class Watched:
    def __init__(self, name, real):
        self._name, self._real = name, real

    def __getattr__(self, attr):
        value = getattr(self._real, attr)
        if not callable(value):
            return value

        def call(*args, **kwargs):
            made.append(f"{self._name}.{attr}")
            return value(*args, **kwargs)

        return call


real = {name: getattr(MPI, name) for name in ("COMM_WORLD", "COMM_SELF", "Op")}


class WatchedOp(MPI.Op):
    @classmethod
    def Create(cls, *args, **kwargs):
        made.append("Op.Create")
        return real["Op"].Create(*args, **kwargs)


registered = []  # the exit and fork handlers registered, by module
register, register_at_fork = atexit.register, os.register_at_fork


def at_exit(function, *args, **kwargs):
    registered.append(f"atexit: {function.__module__}")
    return register(function, *args, **kwargs)


def at_fork(**handlers):
    registered.extend(f"fork: {f.__module__}" for f in handlers.values())
    return register_at_fork(**handlers)


atexit.register, os.register_at_fork = at_exit, at_fork
excepthook, exit = sys.excepthook, sys.exit
MPI.COMM_WORLD = Watched("COMM_WORLD", real["COMM_WORLD"])
MPI.COMM_SELF = Watched("COMM_SELF", real["COMM_SELF"])
MPI.Op = WatchedOp
import collectives as col, ddp, pipeline
for name, value in real.items():
    setattr(MPI, name, value)


def hooks():
    ours = [r for r in registered if r.split()[-1].split(".")[0] in ("collectives", "ddp", "pipeline")]
    return {"excepthook": sys.excepthook is excepthook, "exit": sys.exit is exit, "handlers": ours}


imported = hooks()
comm = col.init(backend="mpi")
print(json.dumps({"made": made, "imported": imported, "initialised": hooks()}), flush=True)
comm.close()
"""


def _this_checkout() -> dict[str, str]:
    """The environment that makes a job import this checkout's packages (a script run from
    elsewhere would find whichever the environment has installed)."""
    return {"PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}


def test_importing_makes_no_mpi_call_and_installs_no_hook(tmp_path):
    # COLLECTIVES_ABORT_ON_EXCEPTION=1: the hooks are wanted at a world of 1 too (one process,
    # no launcher), and so is a timeline, which writes at exit: none of it comes at import
    env = {
        "COLLECTIVES_ABORT_ON_EXCEPTION": "1",
        "COLLECTIVES_TIMELINE": str(tmp_path / "trace"),
        **_this_checkout(),
    }
    with mpi_env(env) as job_env:
        proc = subprocess.run(
            [sys.executable, "-c", IMPORTS],
            cwd=REPO,
            env=job_env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["made"] == [], seen  # no MPI call (an op made, a reduction, a world's size)
    # no hook but the one for a forked child, which changes nothing here (collectives._safety.fork)
    fork = ["fork: collectives._safety.fork"]
    assert seen["imported"] == {"excepthook": True, "exit": True, "handlers": fork}, seen
    # init installs them: the exception hook, sys.exit's wrapper and the exit handlers
    initialised = seen["initialised"]
    assert not initialised["excepthook"] and not initialised["exit"], seen
    assert sorted(initialised["handlers"]) == sorted(
        [
            *fork,
            "atexit: collectives._safety.exit",
            "atexit: collectives._timeline",
        ]
    ), seen
    assert (tmp_path / "trace.rank0.json").exists()


HOOKS_ON_TWO_RANKS = """
import sys
import collectives as col
imported = sys.excepthook is sys.__excepthook__
comm = col.init(backend="mpi", timeout=60)
installed = getattr(sys.excepthook, "_aborts_the_job", False)
print(f"rank {comm.rank}: untouched at import {imported}, installed by init {installed}",
      flush=True)
comm.close()
"""


def test_init_installs_the_hook_that_ends_the_job_on_two_ranks(tmp_path):
    # COLLECTIVES_ABORT_ON_EXCEPTION unset (""): on by default where the world has 2 ranks;
    # that an uncaught exception then ends the job: test_reliability_jobs.py
    env = {"COLLECTIVES_ABORT_ON_EXCEPTION": "", **_this_checkout()}
    proc, _ = _job(tmp_path, HOOKS_ON_TWO_RANKS, 2, env)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    for rank in range(2):
        assert f"rank {rank}: untouched at import True, installed by init True" in output, output
