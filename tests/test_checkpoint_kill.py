"""A rank killed by SIGKILL in the middle of writing a checkpoint: the previous one stays
the newest complete one and loads, the partial one is ignored, and the next save cleans it.

The job is real: ``mpiexec -n 2``; rank 1 watches its own data file appear in the temporary
directory of the second save and kills itself while the file is still being written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

from ddp import checkpoint
from tests.spmd_launcher import REPO, mpi_env, mpiexec

N = 12 << 20  # float64 per rank: 96 MiB, several write chunks, so there is a middle to hit

JOB = f"""
import os, signal, sys, threading, time
from pathlib import Path
import numpy as np
import collectives as col
from ddp import checkpoint

directory = Path(sys.argv[1])
with col.init(timeout=60) as comm:
    local = np.full({N}, float(comm.rank))
    state = {{"x": checkpoint.Shard(local, ({N} * comm.size,), ({N} * comm.rank,))}}
    checkpoint.save(directory, {{**state, "step": 1}}, comm, step=1)
    if comm.rank == 1:
        mine = directory / ".tmp-step-00000002" / "rank-00001.safetensors"
        def kill_mid_write():
            while not (mine.exists() and mine.stat().st_size > 0):
                time.sleep(0.0002)
            (directory / "killed-at").write_text(str(mine.stat().st_size))
            os.kill(os.getpid(), signal.SIGKILL)
        threading.Thread(target=kill_mid_write, daemon=True).start()
    local += 10
    checkpoint.save(directory, {{**state, "step": 2}}, comm, step=2)
    print("the save of step 2 completed: the kill came too late", flush=True)
"""


def test_sigkill_mid_save_leaves_the_previous_checkpoint(tmp_path: Path):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    directory = tmp_path / "ckpt"
    with mpi_env() as env:
        done = subprocess.run(
            [mpiexec(), "-n", "2", sys.executable, str(script), str(directory)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
    assert done.returncode != 0, done.stdout + done.stderr
    killed_at = int((directory / "killed-at").read_text())
    # rank 1 died with its file begun (in the middle of it, unless the machine stalled the
    # watcher past the last write: still before the commit, which needs rank 1)
    assert killed_at > 0
    assert not (directory / "step-00000002").exists()
    assert (directory / ".tmp-step-00000002").is_dir()
    assert checkpoint.latest(directory) == directory / "step-00000001"
    target = {"x": np.empty(2 * N), "step": None}
    assert checkpoint.load(directory, target) == {"step": 1}
    np.testing.assert_array_equal(target["x"][:N], 0.0)
    np.testing.assert_array_equal(target["x"][N:], 1.0)
    checkpoint.save(directory, {"x": np.zeros(1)}, step=3)  # the next save cleans up
    assert sorted(p.name for p in directory.iterdir()) == [
        "killed-at",
        "step-00000001",
        "step-00000003",
    ]
