"""``python -m ddp.checkpoint inspect DIR`` and ``consolidate DIR OUT.safetensors``.

``inspect`` prints every tensor of a checkpoint (or of the newest complete one under DIR)
with its global shape, dtype, and the blocks and files that hold it, then the JSON values.
``consolidate`` checks every file's checksum and writes one safetensors file of whole
tensors by global name (the JSON values go in its metadata, under ``values``), which
``safetensors.numpy.load_file`` reads; it holds the whole state in memory once.

A path that is not a checkpoint, a damaged checkpoint or an output that cannot be written
prints one line on stderr and exits with status 1. Example::

    python -m ddp.checkpoint inspect ckpt
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional

import numpy as np
from safetensors import SafetensorError
from safetensors.numpy import save_file

from ._format import CheckpointError, read_index
from ._load import load, resolve


def inspect(directory: str, out: Any = None) -> None:
    out = sys.stdout if out is None else out
    path = resolve(directory)
    index = read_index(path)
    total = sum(f["bytes"] for f in index["files"].values())
    print(
        f"{path}: step {index['step']}, saved by {index.get('world_size', '?')} ranks, "
        f"{len(index['tensors'])} tensors, {len(index['files'])} files, {total} bytes",
        file=out,
    )
    for name, entry in index["tensors"].items():
        shape = "x".join(str(n) for n in entry["shape"]) or "scalar"
        print(f"{name}  {entry['dtype']}  {shape}  {len(entry['shards'])} shards", file=out)
        for shard in entry["shards"]:
            print(
                f"    offsets {tuple(shard['offsets'])} shape {tuple(shard['shape'])}  "
                f"{shard['file']} [{shard['key']}]",
                file=out,
            )
    for name, value in index["values"].items():
        print(f"{name} = {json.dumps(value)}", file=out)


def consolidate(directory: str, output: str) -> int:
    """Write the whole tensors of a checkpoint into ``output``; returns how many."""
    path = resolve(directory)
    index = read_index(path)
    state: dict[str, Any] = {
        name: np.empty(entry["shape"], dtype=entry["dtype"])
        for name, entry in index["tensors"].items()
    }
    state.update({name: None for name in index["values"]})
    values = load(path, state)
    tensors = {name: state[name] for name in index["tensors"]}
    metadata = {"values": json.dumps(values), "step": str(index["step"])}
    try:
        save_file(tensors, output, metadata=metadata)
    except SafetensorError as error:  # it reports I/O errors as its own
        raise CheckpointError(f"consolidate: cannot write {output}: {error}") from None
    return len(tensors)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ddp.checkpoint", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("inspect", help="list the tensors of a checkpoint").add_argument("directory")
    merge = sub.add_parser("consolidate", help="write one safetensors file of whole tensors")
    merge.add_argument("directory")
    merge.add_argument("output")
    args = parser.parse_args(argv)
    try:
        if args.command == "inspect":
            inspect(args.directory)
        else:
            count = consolidate(args.directory, args.output)
            print(f"wrote {count} tensors to {args.output}")
    except (CheckpointError, OSError) as error:
        # one line, no traceback: the path or the file named is the problem, not the tool
        print(f"{parser.prog} {args.command}: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
