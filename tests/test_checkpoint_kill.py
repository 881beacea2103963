"""Kills in the middle of a save: the newest complete checkpoint always loads, what the kill
left is ignored, and the next save cleans it (or restores it, for the only copy of a step).

The first job is real: ``mpiexec -n 2``; rank 1 watches its own data file appear in the
temporary directory of the second save and kills itself while the file is still being
written. The kill windows of the commit (a step saved again, ``keep=``) are made exact with
``COLLECTIVES_CHECKPOINT_STOP_AT`` (see ``ddp.checkpoint._commit``); a failed save whose
error aborts the job is a 2-rank job too."""

from __future__ import annotations

import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

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


def _two_rank_job(tmp_path: Path, source: str, directory: Path) -> subprocess.CompletedProcess:
    """``source`` run as a script on 2 ranks, given ``directory``; its completed process."""
    script = tmp_path / "job.py"
    script.write_text(source)
    with mpi_env() as env:
        return subprocess.run(
            [mpiexec(), "-n", "2", sys.executable, str(script), str(directory)],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=180,
        )  # fmt: skip


def test_sigkill_mid_save_leaves_the_previous_checkpoint(tmp_path: Path):
    directory = tmp_path / "ckpt"
    done = _two_rank_job(tmp_path, JOB, directory)
    assert done.returncode != 0, done.stdout + done.stderr
    killed_at = int((directory / "killed-at").read_text())
    # rank 1 died with its file begun (in the middle of it, unless the machine stalled the
    # watcher past the last write: still before the commit, which needs rank 1)
    assert killed_at > 0
    assert not (directory / "step-00000002").exists()
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


# A process that SIGKILLs itself at a named point of a save (COLLECTIVES_CHECKPOINT_STOP_AT,
# read by ddp.checkpoint._commit): first step 1 (ones) and step 2 (twos) are saved, then
# step 2 again (threes), or step 3 (threes), killed at the point.
WINDOW = """
import os, sys
import numpy as np
from ddp import checkpoint

directory, point, step = sys.argv[1], sys.argv[2], int(sys.argv[3])
checkpoint.save(directory, {"a": np.full(4, 1.0), "step": 1}, step=1)
checkpoint.save(directory, {"a": np.full(4, 2.0), "step": 2}, step=2)
os.environ["COLLECTIVES_CHECKPOINT_STOP_AT"] = point
checkpoint.save(directory, {"a": np.full(4, 3.0), "step": step}, step=step, keep=1)
print("not killed", flush=True)
"""


def killed_at(tmp_path: Path, point: str, step: int) -> Path:
    script = tmp_path / "window.py"
    script.write_text(WINDOW)
    directory = tmp_path / "ckpt"
    done = subprocess.run(
        [sys.executable, str(script), str(directory), point, str(step)],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == -9, (done.returncode, done.stdout + done.stderr)
    return directory


def loaded(directory: Path) -> tuple[float, int]:
    """The newest complete checkpoint's value and step, read with warnings as errors."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a half-written or half-removed one is never met
        target = {"a": np.zeros(4), "step": None}
        step = checkpoint.load(directory, target)["step"]
    assert len(set(target["a"].tolist())) == 1
    return float(target["a"][0]), step


@pytest.mark.parametrize(
    "point,value",
    [
        ("before-index", 2.0),  # the new copy incomplete: the old one stays
        ("replace-moved-old", 2.0),  # the old copy renamed away, the new one not in yet
        ("replace-renamed-new", 3.0),
        ("replace-mid-remove", 3.0),  # the old copy half removed, its index first
    ],
)
def test_a_kill_while_a_step_is_saved_again_leaves_one_complete_copy(tmp_path, point, value):
    directory = killed_at(tmp_path, point, step=2)
    assert loaded(directory) == (value, 2)
    # the next save restores (or removes) what the kill left, and keeps what keep= asks
    checkpoint.save(directory, {"a": np.full(4, 4.0), "step": 4}, step=4, keep=2)
    assert sorted(p.name for p in directory.iterdir()) == ["step-00000002", "step-00000004"]
    target = {"a": np.zeros(4), "step": None}
    assert checkpoint.load(directory / "step-00000002", target) == {"step": 2}
    assert target["a"].tolist() == [value] * 4


def test_a_kill_in_the_replacement_window_then_a_save_of_the_same_step(tmp_path):
    directory = killed_at(tmp_path, "replace-moved-old", step=2)
    assert checkpoint.latest(directory) == directory / ".tmp-old-step-00000002"
    checkpoint.save(directory, {"a": np.full(4, 5.0), "step": 2}, step=2, keep=1)
    assert sorted(p.name for p in directory.iterdir()) == ["step-00000002"]
    assert loaded(directory) == (5.0, 2)


def test_a_kill_during_keep_never_leaves_a_half_removed_step(tmp_path):
    directory = killed_at(tmp_path, "retention-mid-remove", step=3)
    # step 1 and step 2 go; the kill came while the first was half removed
    assert sorted(p.name for p in directory.glob("step-*")) == [
        "step-00000002",
        "step-00000003",
    ]
    assert [p.name for p in directory.glob(".tmp-*")] == [".tmp-del-step-00000001"]
    assert loaded(directory) == (3.0, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert checkpoint.load(directory / "step-00000002", {"a": np.zeros(4), "step": None})
    checkpoint.save(directory, {"a": np.full(4, 4.0), "step": 4}, step=4, keep=1)
    assert sorted(p.name for p in directory.iterdir()) == ["step-00000004"]


# Rank 1 cannot write its file and its CheckpointError goes uncaught: its abort ends the job.
# Rank 0's clean-up is slowed down so that an abort that does not wait for it kills it midway.
ABORT = """
import shutil, sys, time
from pathlib import Path
import numpy as np
import collectives as col
from ddp import checkpoint
import ddp.checkpoint._save as save_module

directory = Path(sys.argv[1])
with col.init(timeout=60) as comm:
    if comm.rank == 0:
        rmtree = shutil.rmtree
        def slow_rmtree(*args, **kwargs):
            time.sleep(2.0)
            return rmtree(*args, **kwargs)
        shutil.rmtree = slow_rmtree
    else:
        def full_disk(path, tensors, metadata):
            path.write_bytes(b"half a file")
            raise OSError(28, "No space left on device")
        save_module.write_safetensors = full_disk
    local = np.full(4, float(comm.rank))
    state = {"x": checkpoint.Shard(local, (4 * comm.size,), (4 * comm.rank,))}
    checkpoint.save(directory, state, comm, step=1)
"""


def test_a_failed_save_whose_error_aborts_the_job_leaves_no_temporary(tmp_path: Path):
    directory = tmp_path / "ckpt"
    done = _two_rank_job(tmp_path, ABORT, directory)
    assert done.returncode != 0 and "No space left on device" in done.stderr, done.stderr
    assert list(directory.iterdir()) == []
