"""Load: every check first (names, shapes, dtypes, checksums, on every rank together), then
each rank reads only the slices of the saved blocks that overlap the blocks it holds."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from collectives import CommunicatorLike, InvalidArgumentError, array_module

from ._commit import OLD
from ._common import STEP_DIR, exchange, world
from ._format import INDEX, CheckpointError, SafetensorsReader, file_crc32, read_index
from ._save import latest
from ._shard import flatten_state, intersect

__all__ = ["load", "resolve"]


FLOATS = ("float16", "bfloat16", "float32", "float64")  # the dtypes cast=True converts between
HALF = ("float16", "bfloat16")
# a half-precision parameter's float32 master, as OptimizerState and ZeroOptimizer name it
MASTER = re.compile(r"^(?P<head>(?:.+\.)?)optim\.master\.(?P<tail>.+)$")
PARAM = re.compile(r"^(?P<head>(?:.+\.)?)params\.(?P<tail>.+)$")


def _sources(flat: Any, index: dict[str, Any]) -> tuple[dict[str, str], set[str]]:
    """Where the precision changed (``cast=True``), which saved tensor fills which name.

    The float32 master is the truth of a half-precision parameter: a run now in half
    precision takes each master missing from the checkpoint from the saved parameter
    (``*.params.N`` for ``*.optim.master.N``); a run no longer in half precision takes each
    parameter from its saved master. Returns ``{name: saved name read instead}`` and the
    saved names so replaced (not "extra" under ``strict``)."""
    saved = index["tensors"]
    sources: dict[str, str] = {}
    replaced: set[str] = set()
    for name, shards in flat.tensors.items():
        master, param = MASTER.match(name), PARAM.match(name)
        if master and name not in saved:
            source = f"{master['head']}params.{master['tail']}"
            if source in saved:
                sources[name] = source
        elif param and str(shards[0].local.dtype) not in HALF and name in saved:
            source = f"{param['head']}optim.master.{param['tail']}"
            if saved[name]["dtype"] in HALF and source in saved:
                sources[name] = source
                replaced.add(name)
    return sources, replaced


def resolve(path: str | Path) -> Path:
    """``path`` itself if it is a checkpoint, else the newest complete one under it.

    A ``step-*`` directory is a checkpoint even without its index (a load of it then raises
    :class:`CheckpointError` naming the missing file). Example: ``resolve("ckpt")`` ->
    ``Path("ckpt/step-00000012")``.
    """
    path = Path(path)
    name = path.name.removeprefix(OLD)
    if (path / INDEX).is_file() or STEP_DIR.match(name):
        return path
    found = latest(path)
    if found is None:
        raise CheckpointError(f"load: no complete checkpoint in {path}")
    return found


def _problems(flat: Any, index: dict[str, Any], cast: bool, sources: dict[str, str]) -> list[str]:
    """What this rank's state gets wrong against the index (names are checked together)."""
    found = []
    for name, shards in flat.tensors.items():
        saved = index["tensors"].get(sources.get(name, name))
        if saved is None:
            continue
        first = shards[0]
        if list(first.global_shape) != list(saved["shape"]):
            found.append(
                f"{name!r} has global shape {list(first.global_shape)} here, {saved['shape']} "
                "in the checkpoint"
            )
        elif str(first.local.dtype) != saved["dtype"]:
            here = str(first.local.dtype)
            if cast and here in FLOATS and saved["dtype"] in FLOATS:
                continue
            found.append(
                f"{name!r} has dtype {here} here, {saved['dtype']} in the checkpoint"
                + (
                    f" (cast=True converts only between {', '.join(FLOATS)}: integers and "
                    "bools are never cast)"
                    if cast
                    else " (cast=True converts between floating dtypes)"
                )
            )
    for name in flat.values:
        if name in index["tensors"]:
            found.append(f"{name!r} is a tensor in the checkpoint, a JSON value here")
    for name in flat.tensors:
        if name in index["values"]:
            found.append(f"{name!r} is a JSON value in the checkpoint, a tensor here")
    return found


def _substitute(inner: Mapping[str, Any], prefix: str, values: dict[str, Any]) -> dict[str, Any]:
    """``inner`` with its JSON leaves replaced by the loaded values (arrays are filled)."""
    out: dict[str, Any] = {}
    for key, value in inner.items():
        name = f"{prefix}.{key}" if prefix and key else prefix or key
        if name in values:
            out[key] = values[name]
        elif isinstance(value, Mapping):
            out[key] = _substitute(value, name, values)
        else:
            out[key] = value
    return out


def load(
    path: str | Path,
    state: Mapping[str, Any],
    comm: CommunicatorLike | None = None,
    *,
    strict: bool = True,
    verify: bool = True,
    cast: bool = False,
) -> dict[str, Any]:
    """Fill ``state`` (the same kind of mapping :func:`save` takes) from checkpoint ``path``.

    ``path`` is a checkpoint or a directory of them (its newest complete one is taken). The
    arrays and Shards of ``state`` are written in place, whatever mesh saved them; stateful
    objects get ``load_state_dict``; returns the JSON values by global name. Collective
    over ``comm``. Before any array changes, every rank raises :class:`CheckpointError` if
    a name is missing (or, with ``strict``, extra), a global shape or dtype differs, or
    (with ``verify``) a file fails its checksum; the files' checksums are spread over ranks.
    A data file that is not readable safetensors, or lacks a block the index names, is an
    error before any array changes too (``verify=False`` included). With ``cast=True`` a
    tensor saved as float16, bfloat16, float32 or float64 loads into an array of another of
    these dtypes (rounded to it; bfloat16 needs ``ml_dtypes``); other dtypes must match.
    A run may then change precision from its checkpoint: the float32 master of a
    half-precision parameter (``*.optim.master.N``, as :class:`OptimizerState` and
    ``ZeroOptimizer`` save it) missing from the checkpoint is read from the saved parameter
    ``*.params.N``, and a parameter no longer in half precision is read from its saved master.

    Example::

        values = ddp.checkpoint.load("ckpt", {"model": ddp, "optim": zero, "step": 0}, comm)
        start = values["step"]
    """
    me = world(comm)
    try:
        flat = flatten_state(state, "load")
    except InvalidArgumentError as error:
        if me.size > 1:  # the other ranks fail with it now instead of waiting for this one
            exchange(comm, {"problems": [f"rank {me.rank}: {error}"], "names": []})
        raise
    found: dict[str, Any] = {}
    index: dict[str, Any] = {}
    reads: list[tuple[Any, tuple, Any]] = []
    sources: dict[str, str] = {}
    replaced: set[str] = set()
    try:
        checkpoint = resolve(path)
        index = read_index(checkpoint)
        if cast:
            sources, replaced = _sources(flat, index)
        found["problems"] = _problems(flat, index, cast, sources)
        if not found["problems"]:
            reads, found["problems"] = _plan(checkpoint, index, flat, sources)
        if verify:
            files = sorted(index["files"])
            bad = []
            for i in range(me.rank, len(files), me.size):
                name, expected = files[i], index["files"][files[i]]
                try:
                    crc = file_crc32(checkpoint / name)
                except OSError as error:
                    bad.append(f"{checkpoint / name} cannot be read ({error})")
                    continue
                if crc != expected["crc32"]:
                    bad.append(
                        f"{checkpoint / name} fails its checksum (crc32 {crc}, expected "
                        f"{expected['crc32']})"
                    )
            found["problems"] += bad
    except CheckpointError as error:
        found["problems"] = [str(error).removeprefix("load: ")]
    found["names"] = sorted(sources.get(n, n) for n in flat.tensors) + sorted(flat.values)
    found["replaced"] = sorted(replaced)
    every = exchange(comm, found)
    problems = []
    for report in every:
        problems += [p for p in report["problems"] if p not in problems]
    if index:
        asked = set().union(*(set(report["names"]) for report in every))
        replaced = set().union(*(set(report.get("replaced", ())) for report in every))
        saved = set(index["tensors"]) | set(index["values"])
        missing, extra = sorted(asked - saved), sorted(saved - asked - replaced)
        if missing:
            problems.append(f"names missing from the checkpoint: {missing}")
        if extra and strict:
            problems.append(f"names in the checkpoint that the state does not have: {extra}")
    if problems:
        raise CheckpointError(f"load: {path}: " + "; ".join(problems))
    for local, into_mine, block in reads:
        if block.dtype != local.dtype:
            block = block.astype(local.dtype)  # cast=True, checked above; on the host
        local[into_mine] = array_module(local).asarray(block)
    values = {name: index["values"][name] for name in flat.values}
    for obj, prefix, inner in flat.callbacks:
        if hasattr(obj, "load_state_dict"):
            obj.load_state_dict(_substitute(inner, prefix, values))
    return values


def _plan(
    checkpoint: Path, index: dict[str, Any], flat: Any, sources: dict[str, str]
) -> tuple[list[tuple[Any, tuple, Any]], list[str]]:
    """What this rank reads: ``(local array, slices into it, saved block view)`` for each
    overlap, every file's header read and every block found in it (no data read yet);
    and the problems found instead, naming the file."""
    files: dict[str, SafetensorsReader] = {}
    reads, problems = [], []
    for name, shards in flat.tensors.items():
        entry = index["tensors"].get(sources.get(name, name))
        if entry is None:
            continue  # a missing name: reported once all ranks' names are known
        dtype = entry["dtype"]
        for shard in shards:
            filled = 0
            for saved in entry["shards"]:
                overlap = intersect(shard.offsets, shard.shape, saved["offsets"], saved["shape"])
                if overlap is None:
                    continue
                into_mine, into_saved = overlap
                try:
                    if saved["file"] not in files:
                        files[saved["file"]] = SafetensorsReader(checkpoint / saved["file"])
                    block = files[saved["file"]].get(saved["key"], dtype, saved["shape"])
                except CheckpointError as error:
                    problems.append(str(error).removeprefix("load: "))
                    return [], problems
                reads.append((shard.local, into_mine, block[into_saved]))
                filled += math.prod(s.stop - s.start for s in into_mine)
            if filled != math.prod(shard.shape):
                problems.append(
                    f"{name!r} at offsets {list(shard.offsets)} gets {filled} of "
                    f"{math.prod(shard.shape)} elements from the checkpoint"
                )
    return reads, problems
