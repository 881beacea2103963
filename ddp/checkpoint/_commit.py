"""How checkpoint directories change on disk, so that a kill at any point leaves the newest
complete checkpoint loadable.

Names under a checkpoint directory:

- ``step-NNNNNNNN``: a committed checkpoint (complete when its index is valid);
- ``.tmp-step-N``: a save in progress, renamed to ``step-N`` once its index is written;
- ``.tmp-old-step-N``: the previous copy of ``step-N`` while a save of the same step
  replaces it. It is renamed away before the new copy is renamed in (a directory cannot
  be renamed onto a non-empty one) and removed, index first, only after. A kill between
  the two renames leaves it as the only copy of step N: :func:`candidates` offers it and
  :func:`recover` (the next save) renames it back;
- ``.tmp-del-step-N``: a checkpoint being removed by ``keep=``: renamed away first, so a
  half-deleted one never counts as complete.

Only rank 0 renames and removes; every ``.tmp-*`` but a ``.tmp-old-*`` to restore is
removed by the next save (not by readers: a reader cannot tell a killed save from one in
flight in another process).

Kill points, for tests only: with ``COLLECTIVES_CHECKPOINT_STOP_AT=<point>`` in its
environment, a process SIGKILLs itself when it reaches ``<point>``; the points are the
names passed to :func:`stop_at` (``before-index``, ``replace-moved-old``,
``replace-renamed-new``, ``replace-mid-remove``, ``retention-mid-remove``).
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

from ._common import STEP_DIR, TEMP_PREFIX
from ._format import INDEX, fsync_dir

__all__ = ["candidates", "commit", "recover", "remove", "retain", "stop_at"]

OLD = TEMP_PREFIX + "old-"
DELETED = TEMP_PREFIX + "del-"
_STOP_AT = "COLLECTIVES_CHECKPOINT_STOP_AT"


def stop_at(point: str) -> None:
    """SIGKILL this process here when the environment names ``point`` (tests of kill windows)."""
    if os.environ.get(_STOP_AT) == point:
        os.kill(os.getpid(), signal.SIGKILL)


def candidates(directory: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every checkpoint that may be complete, oldest first: each
    ``step-N``, and each ``.tmp-old-step-N`` whose ``step-N`` is missing (a replacement
    killed between its renames). Their indexes are not read here."""
    found: dict[int, Path] = {}
    olds: dict[int, Path] = {}
    if Path(directory).is_dir():
        for entry in Path(directory).iterdir():
            if not entry.is_dir():
                continue
            match = STEP_DIR.match(entry.name)
            if match:
                found[int(match.group(1))] = entry
            elif entry.name.startswith(OLD):
                match = STEP_DIR.match(entry.name[len(OLD) :])
                if match:
                    olds[int(match.group(1))] = entry
    for step, path in olds.items():
        found.setdefault(step, path)
    return sorted(found.items())


def remove(path: Path, point: str) -> None:
    """Remove checkpoint directory ``path``, its index first: a kill midway leaves a
    directory that no reader takes for complete."""
    index = path / INDEX
    if index.exists():
        index.unlink()
        fsync_dir(path)
    for i, entry in enumerate(sorted(path.iterdir())):
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        if i == 0:
            stop_at(point)
    path.rmdir()


def commit(temp: Path, final: Path) -> None:
    """Rename the complete ``temp`` to ``final``, replacing an older copy of the same step
    such that one complete copy exists at every moment."""
    stale = final.with_name(OLD + final.name)
    if final.exists():  # the same step saved again: the new one replaces it
        if stale.exists():  # left by a kill after an earlier replacement: step-N is newer
            shutil.rmtree(stale)
        final.rename(stale)
        stop_at("replace-moved-old")
    temp.rename(final)
    fsync_dir(final.parent)
    if stale.exists():
        stop_at("replace-renamed-new")
        remove(stale, "replace-mid-remove")


def retain(directory: Path, complete: list[Path], keep: int) -> None:
    """Remove all but the newest ``keep`` of ``complete`` (oldest first), each renamed
    away before its files are removed."""
    for old in complete[:-keep]:
        away = directory / (DELETED + old.name)
        if away.exists():
            shutil.rmtree(away)
        old.rename(away)
        fsync_dir(directory)
        remove(away, "retention-mid-remove")


def recover(directory: Path) -> None:
    """Before a save (rank 0): restore each ``.tmp-old-step-N`` whose ``step-N`` a kill left
    missing, then remove every other ``.tmp-*`` (partial saves, half-removed checkpoints)."""
    for _, path in candidates(directory):
        if path.name.startswith(OLD) and (path / INDEX).is_file():
            path.rename(path.with_name(path.name[len(OLD) :]))
    removed = False
    for entry in directory.iterdir():
        if entry.name.startswith(TEMP_PREFIX):
            shutil.rmtree(entry, ignore_errors=True)
            removed = True
    if removed:
        fsync_dir(directory)
