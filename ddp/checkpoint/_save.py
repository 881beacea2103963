"""Save: every rank writes its blocks at once, each replicated block by one of its holders,
under a temporary directory committed by renaming it after the index is written (the
renames and removals, and the kill points tests use: :mod:`ddp.checkpoint._commit`)."""

from __future__ import annotations

import math
import secrets
import shutil
import socket
import threading
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import numpy as np

from collectives import CommunicatorLike, InvalidArgumentError

from ._commit import candidates, commit, recover, retain, stop_at
from ._common import TEMP_PREFIX, exchange, step_dir, to_host, world
from ._format import (
    FORMAT,
    VERSION,
    CheckpointError,
    NewerFormatError,
    dtype_code,
    fsync_dir,
    read_index,
    shard_key,
    write_index,
    write_safetensors,
)
from ._shard import Flat, flatten_state

__all__ = ["save", "SaveHandle", "latest", "assign_writers", "tensor_table"]

_PENDING: list[SaveHandle] = []  # async saves not yet committed, completed by the next save
# Host buffers of the last async save, reused by the next one (its writes are over by then):
# fresh memory costs a page fault per page, which made the copy several times slower.
_STAGING: dict[tuple, np.ndarray] = {}
# Rank 0 leaves a file of this name and a token drawn for the save in the temporary
# directory; a rank that does not find it there saves to another folder than rank 0 (one
# of its own node's, not shared), and says so instead of writing where no index will be.
_MARK = ".made-by-rank-0-"


def latest(directory: str | Path) -> Optional[Path]:
    """The newest complete checkpoint under ``directory`` (None if there is none).

    Partial ones (a save killed midway leaves a ``.tmp-*`` directory) are never returned. A
    ``step-*`` directory whose index is missing or fails its checksum is skipped with a
    warning naming it (one of a newer format version is returned). Where a kill interrupted the replacement of step N by a save of the
    same step, the previous copy ``.tmp-old-step-N`` is returned (the next save restores
    it as ``step-N``). Example: ``ddp.checkpoint.latest("ckpt")`` ->
    ``Path("ckpt/step-00000012")``.
    """
    for _, path in reversed(candidates(Path(directory))):
        try:
            read_index(path, "latest")
        except NewerFormatError:
            return path  # complete, for a newer library: load says to upgrade
        except CheckpointError as error:
            warnings.warn(f"{error}; skipped", RuntimeWarning, stacklevel=2)
            continue
        return path
    return None


def _complete(directory: Path) -> list[Path]:
    """The complete checkpoints under ``directory``, oldest first (no warnings: for keep=)."""
    found = []
    for _, path in candidates(directory):
        try:
            read_index(path, "save")
        except CheckpointError:
            continue
        found.append(path)
    return found


def assign_writers(table: dict[str, dict[str, Any]]) -> dict[tuple[str, tuple, tuple], int]:
    """Which rank writes each block of ``table`` (from :func:`tensor_table`).

    A block held by several ranks (replicated over data parallel) goes to the holder with the
    fewest bytes so far, the largest blocks first, so the writing is spread over the
    replicas. Example: two ranks each holding the same two tensors of 8 and 4 bytes write
    one each.
    """
    sizes, holders = {}, {}
    for name, entry in table.items():
        for (offsets, shape), ranks in entry["blocks"].items():
            sizes[(name, offsets, shape)] = math.prod(shape) * entry["itemsize"]
            holders[(name, offsets, shape)] = ranks
    load: dict[int, int] = {}
    writers = {}
    for key in sorted(sizes, key=lambda k: (-sizes[k], k[0], k[1])):
        rank = min(holders[key], key=lambda r: (load.get(r, 0), r))
        writers[key] = rank
        load[rank] = load.get(rank, 0) + sizes[key]
    return writers


def _overlap(a: tuple, b: tuple) -> bool:
    (ao, ash), (bo, bsh) = a, b
    return all(max(x, y) < min(x + n, y + m) for x, n, y, m in zip(ao, ash, bo, bsh))


def tensor_table(metas: list[dict[str, Any]], call: str) -> dict[str, dict[str, Any]]:
    """Every tensor's dtype, global shape and blocks (each with the ranks that hold it).

    ``metas[r]["tensors"][name]`` is rank r's ``{"dtype", "itemsize", "shape", "blocks":
    [[offsets, shape], ...]}``. Ranks are taken in order; a block that partly overlaps one
    already taken is the same data cut another way (a tied weight under ZeRO on two
    pipeline stages) and is skipped. The blocks taken must cover the tensor exactly.
    Example: ranks 0 and 1 each holding ``w`` whole give one block held by ``[0, 1]``.
    """
    table: dict[str, dict[str, Any]] = {}
    for rank, meta in enumerate(metas):
        for name, info in meta["tensors"].items():
            entry = table.setdefault(
                name,
                {
                    "dtype": info["dtype"],
                    "itemsize": int(info["itemsize"]),
                    "shape": info["shape"],
                    "blocks": {},
                },
            )
            if entry["dtype"] != info["dtype"] or entry["shape"] != info["shape"]:
                raise InvalidArgumentError(
                    f"{call}: ranks disagree on {name!r}: dtype {entry['dtype']}, shape "
                    f"{entry['shape']} on a lower rank, dtype {info['dtype']}, shape "
                    f"{info['shape']} on rank {rank}"
                )
            blocks = entry["blocks"]
            for offsets, shape in info["blocks"]:
                block = (tuple(offsets), tuple(shape))
                if block in blocks:
                    if rank not in blocks[block]:
                        blocks[block].append(rank)
                elif not any(_overlap(block, taken) for taken in blocks):
                    blocks[block] = [rank]
    for name, entry in table.items():
        covered = sum(math.prod(s) for _, s in entry["blocks"])
        if covered != math.prod(entry["shape"]):
            raise InvalidArgumentError(
                f"{call}: the blocks of {name!r} cover {covered} of its "
                f"{math.prod(entry['shape'])} elements (global shape {entry['shape']})"
            )
    return table


class SaveHandle:
    """A save in flight: :meth:`wait` (collective: every rank calls it) commits it.

    The next :func:`save` waits for it too. Example::

        handle = ddp.checkpoint.save("ckpt", state, comm, step=3, async_op=True)
        train_more()              # may change the arrays: the save holds host copies
        path = handle.wait()
    """

    def __init__(
        self,
        comm: CommunicatorLike | None,
        temp: Path,
        final: Path,
        step: int,
        keep: Optional[int],
        plan: dict,
        mark: str = "",
    ) -> None:
        self.comm, self.temp, self.final, self.step, self.keep = comm, temp, final, step, keep
        self._plan = plan
        self._mark = mark  # rank 0's mark in temp; "": none to look for (one rank)
        #: whether rank 0's temporary directory is seen here (false: the folder is not shared)
        self.sees_rank_0 = not mark or (temp / mark).exists()
        self._result: dict[str, Any] = {}
        self._thread: Optional[threading.Thread] = None
        self._path: Optional[Path] = None
        self._error: Optional[BaseException] = None
        #: seconds this rank spent writing its file (the background part)
        self.write_seconds = 0.0

    def _write(self) -> None:
        rank = world(self.comm).rank
        tensors = self._plan["tensors"]
        start = time.perf_counter()
        try:
            if not self.sees_rank_0:
                self._result = {"error": self._not_shared(rank)}
            elif tensors:
                name = f"rank-{rank:05d}.safetensors"
                nbytes, crc = write_safetensors(
                    self.temp / name, tensors, {"format": FORMAT, "rank": str(rank)}
                )
                self._result = {"file": name, "bytes": nbytes, "crc32": crc}
            else:
                self._result = {}
        except Exception as error:  # reported to every rank in wait()
            self._result = {"error": f"rank {rank}: {type(error).__name__}: {error}"}
        self.write_seconds = time.perf_counter() - start

    def _not_shared(self, rank: int) -> str:
        folder = self.final.parent
        return (
            f"rank {rank} (on {socket.gethostname()}) does not see in {folder} the "
            f"{self.temp.name} that rank 0 made there: every rank must save to the same "
            "folder, seen by all (a shared file system), not one of its own node's"
        )

    def _start(self, background: bool) -> None:
        if background:
            self._thread = threading.Thread(target=self._write, name="checkpoint-save")
            self._thread.daemon = True
            self._thread.start()
            _PENDING.append(self)
        else:
            self._write()

    def is_completed(self) -> bool:
        """Whether this rank's file is written (the commit still needs :meth:`wait`)."""
        return self._thread is None or not self._thread.is_alive()

    def wait(self) -> Path:
        """Finish this rank's writing, then commit on every rank; the checkpoint's path.

        Collective. Raises :class:`CheckpointError` on every rank if any rank failed.
        """
        if self._path is not None or self._error is not None:
            if self._error is not None:
                raise self._error
            return self._path  # type: ignore[return-value]
        if self._thread is not None:
            self._thread.join()
        if self in _PENDING:
            _PENDING.remove(self)
        try:
            self._path = self._commit()
        except BaseException as error:
            self._error = error
            raise
        return self._path

    def _commit(self) -> Path:
        comm = self.comm
        try:
            results = exchange(comm, self._result)
        except BaseException:  # a rank died or timed out: leave no partial save behind
            self._clean_up()
            raise
        errors = [r["error"] for r in results if "error" in r]
        if errors:
            self._clean_up()
            # no rank raises (whose abort may kill the job) before rank 0 has cleaned up
            exchange(comm, {})
            raise CheckpointError(f"save: step {self.step} failed: " + "; ".join(errors))
        outcome: dict[str, Any] = {}
        if world(comm).rank == 0:
            try:
                if self._mark:  # every rank has looked for it
                    (self.temp / self._mark).unlink()
                self._write_index(results)
                commit(self.temp, self.final)
            except Exception as error:
                outcome = {"error": f"rank 0: {type(error).__name__}: {error}"}
                self._clean_up()
        outcome = exchange(comm, outcome)[0]
        if "error" in outcome:
            raise CheckpointError(f"save: step {self.step} failed: {outcome['error']}")
        if self.keep is not None and world(comm).rank == 0:
            try:
                retain(self.final.parent, _complete(self.final.parent), self.keep)
            except OSError as error:  # the save itself is committed
                warnings.warn(
                    f"save(keep={self.keep}): cannot remove an older checkpoint: {error}",
                    RuntimeWarning,
                    stacklevel=3,
                )
        return self.final

    def _clean_up(self) -> None:
        """Remove this rank's file of a failed save and, on rank 0, the temporary directory."""
        if self._result.get("file"):
            (self.temp / self._result["file"]).unlink(missing_ok=True)
        if world(self.comm).rank == 0:
            shutil.rmtree(self.temp, ignore_errors=True)

    def _write_index(self, results: list[dict[str, Any]]) -> None:
        table, writers = self._plan["table"], self._plan["writers"]
        files = {r["file"]: {"bytes": r["bytes"], "crc32": r["crc32"]} for r in results if r}
        tensors: dict[str, Any] = {}
        for name, entry in sorted(table.items()):
            shards = []
            for offsets, shape in sorted(entry["blocks"]):
                rank = writers[(name, offsets, shape)]
                shards.append(
                    {
                        "offsets": list(offsets),
                        "shape": list(shape),
                        "file": f"rank-{rank:05d}.safetensors",
                        "key": shard_key(name, offsets),
                    }
                )
            tensors[name] = {"dtype": entry["dtype"], "shape": entry["shape"], "shards": shards}
        index = {
            "format": FORMAT,
            "version": VERSION,
            "step": self.step,
            "world_size": world(self.comm).size,
            "files": files,
            "tensors": tensors,
            "values": self._plan["values"],
        }
        stop_at("before-index")
        write_index(self.temp, index)
        fsync_dir(self.temp)


def _local_meta(flat: Flat) -> dict[str, Any]:
    tensors = {}
    for name, shards in flat.tensors.items():
        first = shards[0]
        tensors[name] = {
            "dtype": str(first.local.dtype),
            "itemsize": int(first.local.dtype.itemsize),
            "shape": list(first.global_shape),
            "blocks": [[list(s.offsets), list(s.shape)] for s in shards],
        }
    return {"tensors": tensors, "values": flat.values}


def save(
    directory: str | Path,
    state: Mapping[str, Any],
    comm: CommunicatorLike | None = None,
    *,
    step: int,
    keep: Optional[int] = None,
    async_op: bool = False,
) -> Any:
    """Save ``state`` (see :mod:`ddp.checkpoint`) as ``directory/step-{step:08d}``.

    Collective over ``comm`` (None: this process alone); every rank passes its own part of
    the state, by global names. Every rank writes its blocks in parallel, a block held by
    several ranks is written by one of them, the index last; the directory appears under
    its final name only when complete. ``keep=N`` then removes all but the newest N.

    With ``async_op=True`` the arrays are copied to host memory and a :class:`SaveHandle`
    is returned while the files are written in the background; call ``handle.wait()`` on
    every rank (or the next ``save`` does) to commit. Synchronous: returns the path.

    Example::

        ddp.checkpoint.save("ckpt", {"model": ddp, "optim": zero, "step": 3}, comm, step=3)
    """
    call = "save"
    if int(step) != step or step < 0:
        raise InvalidArgumentError(f"{call}: step must be an integer >= 0, got {step!r}")
    if keep is not None and (int(keep) != keep or keep < 1):
        raise InvalidArgumentError(f"{call}: keep must be an integer >= 1 or None, got {keep!r}")
    alone = comm is None or comm.size == 1
    try:
        flat = flatten_state(state, call)
        for name, shards in flat.tensors.items():
            dtype_code(shards[0].local.dtype, call, name)
        meta = _local_meta(flat)
    except InvalidArgumentError as error:
        if alone:
            raise
        # told to the other ranks in the exchange below, so that they fail now, with it,
        # rather than wait for this one until the timeout
        meta, mistake = {"error": str(error)}, error
    for handle in list(_PENDING):
        if handle.comm is comm:
            handle.wait()
    directory = Path(directory)
    rank = world(comm).rank
    temp = directory / f"{TEMP_PREFIX}step-{step:08d}"
    if rank == 0:
        directory.mkdir(parents=True, exist_ok=True)
        recover(directory)  # what saves killed midway left
        temp.mkdir()
        if not alone:
            meta = {**meta, "mark": _MARK + secrets.token_hex(8)}
            (temp / meta["mark"]).touch()
    metas = exchange(comm, meta)  # also: the directory exists from here on
    try:
        wrong = [f"rank {r}: {m['error']}" for r, m in enumerate(metas) if "error" in m]
        if "error" in meta:
            raise mistake
        if wrong:
            raise InvalidArgumentError(f"{call}: another rank's state is bad: " + "; ".join(wrong))
        table = tensor_table(metas, call)
    except InvalidArgumentError:
        if rank == 0:
            shutil.rmtree(temp, ignore_errors=True)
        if not alone:  # no rank raises (and may abort the job) before rank 0 has cleaned up
            exchange(comm, {})
        raise
    writers = assign_writers(table)
    values: dict[str, Any] = {}
    for each in metas:  # a JSON value from the lowest rank that gives it
        for name, value in each["values"].items():
            values.setdefault(name, value)
    mine, taken = [], set()
    staging: dict[tuple, np.ndarray] = {}
    for name, shards in flat.tensors.items():
        for shard in shards:
            key = (name, shard.offsets, shard.shape)
            if writers.get(key) == rank and key not in taken:
                taken.add(key)
                if async_op:
                    array = _stage(key, shard.local, staging)
                else:
                    array = _c_order(to_host(shard.local, copy=False))
                mine.append((shard_key(name, shard.offsets), array))
    if async_op:
        _STAGING.clear()
        _STAGING.update(staging)
    plan = {"tensors": mine, "table": table, "writers": writers, "values": values}
    mark = metas[0].get("mark", "")
    handle = SaveHandle(comm, temp, step_dir(directory, int(step)), int(step), keep, plan, mark)
    handle._start(background=async_op)
    return handle if async_op else handle.wait()


def _c_order(array: np.ndarray) -> np.ndarray:
    # not np.ascontiguousarray: it turns a 0-d array into shape (1,)
    return array if array.flags.c_contiguous else array.copy(order="C")


def _stage(key: tuple, local: Any, staging: dict[tuple, np.ndarray]) -> np.ndarray:
    """A host copy of ``local`` in the buffer the last async save used for ``key``."""
    buffer = None if _PENDING else _STAGING.get(key)  # never one a save in flight still writes
    if buffer is None or buffer.dtype != local.dtype or buffer.shape != tuple(local.shape):
        buffer = np.empty(tuple(local.shape), dtype=local.dtype)
    if hasattr(local, "get") and not isinstance(local, np.ndarray):
        local.get(out=buffer)  # CuPy: device to host
    else:
        np.copyto(buffer, local)
    staging[key] = buffer
    return buffer
