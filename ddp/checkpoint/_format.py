"""The on-disk format: safetensors data files and one JSON index, written last.

A checkpoint is a directory ``step-00000012/`` holding ``rank-00003.safetensors`` (the
blocks rank 3 wrote; a rank with nothing to write writes no file) and ``index.json``::

    {"format": "collectives-checkpoint", "version": 2, "step": 12,
     "files": {"rank-00003.safetensors": {"bytes": 4096, "crc32": 1234567}},
     "tensors": {"h0.w_qkv": {"dtype": "float64", "shape": [32, 96],
                              "shards": [{"offsets": [0, 48], "shape": [32, 48],
                                          "file": "rank-00003.safetensors",
                                          "key": "h0.w_qkv@0,48"}]}},
     "values": {"step": 12},
     "checksum": "9f86d08..."}

``crc32`` is zlib's CRC-32 of the whole file. Each shard is the tensor ``key`` of its file
(a plain safetensors file: ``safetensors.numpy.load_file`` reads it), the block of the
global tensor at ``offsets``. The shards of a tensor cover it exactly once. ``checksum`` is
the SHA-256 (hex) of the index without it, as canonical JSON (keys sorted, no spaces), so a
damaged index is refused rather than read as another step; version 1 had no checksum.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from collectives import CollectivesError, InvalidArgumentError

FORMAT = "collectives-checkpoint"
VERSION = 2  # 2: the index carries its own checksum
INDEX = "index.json"
CHUNK = 64 << 20  # bytes per write and per checksum pass: large enough to stream, small
# enough that a multi-GiB tensor does not need one more copy of itself

#: NumPy dtype name -> safetensors dtype code
DTYPES = {
    "bool": "BOOL",
    "uint8": "U8",
    "int8": "I8",
    "int16": "I16",
    "uint16": "U16",
    "float16": "F16",
    "bfloat16": "BF16",
    "int32": "I32",
    "uint32": "U32",
    "float32": "F32",
    "float64": "F64",
    "int64": "I64",
    "uint64": "U64",
}


class CheckpointError(CollectivesError):
    """A checkpoint cannot be written or read: a failed write, a bad checksum, a state
    that does not match the checkpoint, an index from a newer format version."""


class NewerFormatError(CheckpointError):
    """An index of a format version newer than this library reads (not damage: a reader
    reports it rather than skip to an older checkpoint)."""


def dtype_code(dtype: Any, call: str, name: str) -> str:
    """The safetensors code of ``dtype``, or a clear error naming the tensor."""
    code = DTYPES.get(str(np.dtype(dtype)) if str(dtype) != "bfloat16" else "bfloat16")
    if code is None:
        raise InvalidArgumentError(
            f"{call}: {name!r} has dtype {dtype}, expected one of {sorted(DTYPES)}"
        )
    return code


def shard_key(name: str, offsets: tuple[int, ...]) -> str:
    """The tensor name of a block inside its file: ``name@o0,o1``."""
    return f"{name}@{','.join(str(o) for o in offsets)}"


def write_safetensors(
    path: Path, tensors: list[tuple[str, np.ndarray]], metadata: dict[str, str]
) -> tuple[int, int]:
    """Write a safetensors file, streaming, flushed and fsynced; return ``(bytes, crc32)``."""
    header: dict[str, Any] = {"__metadata__": metadata}
    position = 0
    for key, array in tensors:
        header[key] = {
            "dtype": dtype_code(array.dtype, "save", key),
            "shape": list(array.shape),
            "data_offsets": [position, position + array.nbytes],
        }
        position += array.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # safetensors aligns the data to 8 bytes with spaces
    head = struct.pack("<Q", len(text)) + text
    # The data goes to the page cache first; then the disk flush (fsync, which waits on the
    # device) runs on a thread while this one computes the CRC-32 from memory (CPU), so
    # the two overlap instead of adding up.
    with open(path, "wb") as f:
        f.write(head)
        views = [np.ascontiguousarray(a).reshape(-1).view(np.uint8).data for _, a in tensors]
        for data in views:
            for lo in range(0, len(data), CHUNK):
                f.write(data[lo : lo + CHUNK])
        f.flush()
        with ThreadPoolExecutor(1) as worker:
            flushed = worker.submit(os.fsync, f.fileno())
            crc = zlib.crc32(head)
            for data in views:
                for lo in range(0, len(data), CHUNK):
                    crc = zlib.crc32(data[lo : lo + CHUNK], crc)
            flushed.result()
    return len(head) + position, crc


def file_crc32(path: Path) -> int:
    """zlib's CRC-32 of a whole file, read through a memory map (no copy out of the page cache)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    data = np.memmap(path, dtype=np.uint8, mode="r")
    crc = 0
    for lo in range(0, size, CHUNK):
        crc = zlib.crc32(data[lo : lo + CHUNK].data, crc)
    return crc


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (new files, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def index_checksum(index: dict[str, Any]) -> str:
    """SHA-256 (hex) of ``index`` without its ``checksum``, as canonical JSON."""
    body = {k: v for k, v in index.items() if k != "checksum"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def write_index(path: Path, index: dict[str, Any]) -> None:
    index = {**index, "checksum": index_checksum(index)}
    with open(path / INDEX, "w") as f:
        json.dump(index, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def read_index(path: Path, call: str = "load") -> dict[str, Any]:
    """The index of checkpoint ``path``, checked for format, version and checksum."""
    file = Path(path) / INDEX
    try:
        index = json.loads(file.read_text())
    except FileNotFoundError:
        raise CheckpointError(
            f"{call}: {file} is missing: {path} is not a complete checkpoint"
        ) from None
    except (OSError, ValueError) as error:  # UnicodeDecodeError is a ValueError
        raise CheckpointError(f"{call}: cannot read {file}: {error}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        raise CheckpointError(f"{call}: {file} is not a {FORMAT} index")
    version = index.get("version")
    if not isinstance(version, int) or version < 1:
        raise CheckpointError(
            f"{call}: {file} has format version {version!r}, expected 1 to {VERSION}"
        )
    if version > VERSION:
        raise NewerFormatError(
            f"{call}: {file} has format version {version}, newer than this "
            f"library reads ({VERSION}): upgrade the library"
        )
    if version >= 2 and index.get("checksum") != index_checksum(index):
        raise CheckpointError(
            f"{call}: {file} fails its checksum (sha256 of its contents "
            f"{index_checksum(index)[:16]}..., the index says {str(index.get('checksum'))[:16]}...):"
            " the index is damaged"
        )
    return index


class SafetensorsReader:
    """The tensors of a safetensors file as read-only views of a memory map: a slice of one
    reads only the pages it covers, straight into the array it is assigned to.

    A file that is not a readable safetensors file raises :class:`CheckpointError` naming
    it, here or in :meth:`get`, before any data is read."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            size = os.path.getsize(path)
            with open(path, "rb") as f:
                (length,) = struct.unpack("<Q", f.read(8))
                if length > size - 8:
                    raise ValueError(f"a header of {length} bytes in a file of {size} bytes")
                header = json.loads(f.read(length))
            if not isinstance(header, dict):
                raise ValueError(f"the header is a JSON {type(header).__name__}, not an object")
            self.header = header
            self.size = size - 8 - length
            self.data = (
                np.memmap(path, dtype=np.uint8, mode="r", offset=8 + length)
                if self.size
                else np.zeros(0, np.uint8)  # a memory map cannot be empty
            )
        except (OSError, ValueError, struct.error) as error:
            raise CheckpointError(
                f"load: cannot read {path} as safetensors: {type(error).__name__}: {error}"
            ) from None

    def get(self, key: str, dtype: str, shape: list[int]) -> np.ndarray:
        """Tensor ``key``, checked to have ``dtype`` and ``shape`` and to lie in the file."""
        entry = self.header.get(key)
        if (
            not isinstance(entry, dict)
            or entry.get("shape") != list(shape)
            or entry.get("dtype") != DTYPES.get(dtype)
        ):
            held = (entry.get("dtype"), entry.get("shape")) if isinstance(entry, dict) else entry
            raise CheckpointError(
                f"load: {self.path} holds {key!r} as {held}, the index says {dtype} {list(shape)}"
            )
        numpy_dtype = _numpy_dtype(dtype)
        nbytes = math.prod(shape) * np.dtype(numpy_dtype).itemsize
        offsets = entry.get("data_offsets")
        if (
            not isinstance(offsets, list)
            or len(offsets) != 2
            or not all(isinstance(o, int) for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= self.size
            or offsets[1] - offsets[0] != nbytes
        ):
            raise CheckpointError(
                f"load: {self.path} gives {key!r} the data offsets {offsets}, expected "
                f"{nbytes} bytes within the file's {self.size} bytes of data"
            )
        begin, end = offsets
        return self.data[begin:end].view(numpy_dtype).reshape(shape)


def _numpy_dtype(name: str) -> Any:
    if name == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(name)
