"""Damaged checkpoints and failed saves in one process: a damaged or missing index is never
read as another step, damaged data files are a CheckpointError naming the file (checksums
checked or not), the tools print one line, and a failed save leaves no ``.tmp-*``.

Kill windows (a process killed mid-save or mid-removal) are in tests/test_checkpoint_kill.py.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import ddp.checkpoint._save as save_module
from ddp import checkpoint
from ddp.checkpoint import CheckpointError
from ddp.checkpoint.__main__ import main as tool
from tests.spmd_launcher import REPO


def two_steps(directory: Path) -> tuple[Path, Path]:
    first = checkpoint.save(directory, {"a": np.full(4, 1.0), "step": 1}, step=1)
    second = checkpoint.save(directory, {"a": np.full(4, 2.0), "step": 2}, step=2)
    return first, second


def test_a_deleted_newest_index_is_named_not_skipped_silently(tmp_path):
    _, second = two_steps(tmp_path)
    (second / "index.json").unlink()
    with pytest.warns(RuntimeWarning, match=r"step-00000002/index.json is missing.*skipped"):
        assert checkpoint.latest(tmp_path) == tmp_path / "step-00000001"
    with pytest.raises(CheckpointError, match=r"step-00000002/index.json is missing"):
        checkpoint.load(second, {"a": np.zeros(4), "step": None})


def test_a_flipped_bit_in_the_index_fails_its_checksum(tmp_path):
    _, second = two_steps(tmp_path)
    file = second / "index.json"
    text = file.read_bytes()
    at = text.index(b'"step": 2')  # the index's step: 2 -> 3, still valid JSON
    flipped = text[: at + 8] + bytes([text[at + 8] ^ 0x01]) + text[at + 9 :]
    assert json.loads(flipped)["step"] == 3
    file.write_bytes(flipped)
    target = {"a": np.zeros(4), "step": None}
    with pytest.raises(CheckpointError, match=r"step-00000002/index.json fails its checksum"):
        checkpoint.load(second, target)
    with pytest.warns(RuntimeWarning, match=r"step-00000002/index.json fails its checksum"):
        assert checkpoint.load(tmp_path, target) == {"step": 1}
    assert target["a"].tolist() == [1.0] * 4


def test_the_index_checksum_covers_every_field(tmp_path):
    path = checkpoint.save(tmp_path, {"a": np.ones(2)}, step=7)
    index = json.loads((path / "index.json").read_text())
    assert len(index["checksum"]) == 64 and index["version"] == checkpoint.VERSION
    index["step"] = 8
    (path / "index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="fails its checksum"):
        checkpoint.load(path, {"a": np.zeros(2)})


def damage(kind: str, file: Path) -> None:
    data = file.read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    if kind == "truncated":
        file.write_bytes(data[: len(data) - 9])
    elif kind == "empty":
        file.write_bytes(b"")
    elif kind == "header-not-utf8":
        file.write_bytes(data[:8] + b"\xff\xfe" + data[10:])
    elif kind == "header-too-long":
        file.write_bytes(struct.pack("<Q", len(data) * 2) + data[8:])
    elif kind == "header-not-json":
        file.write_bytes(data[:8] + b"[" * length + data[8 + length :])
    elif kind == "missing":
        file.unlink()


@pytest.mark.parametrize(
    "kind",
    ["truncated", "empty", "header-not-utf8", "header-too-long", "header-not-json", "missing"],
)
def test_damaged_data_files_name_the_file_without_checksums(tmp_path, kind):
    path = checkpoint.save(tmp_path, {"a": np.arange(8.0), "b": np.ones(3)}, step=1)
    file = path / "rank-00000.safetensors"
    damage(kind, file)
    target = {"a": np.zeros(8), "b": np.zeros(3)}
    with pytest.raises(CheckpointError, match="rank-00000.safetensors"):
        checkpoint.load(path, target, verify=False)
    assert target["a"].tolist() == [0.0] * 8 and target["b"].tolist() == [0.0] * 3


@pytest.mark.parametrize("command", ["inspect", "consolidate"])
@pytest.mark.parametrize("where", ["nowhere", "step-00000003", "empty"])
def test_the_tools_print_one_line_for_a_bad_path(tmp_path, command, where):
    (tmp_path / "empty").mkdir()
    (tmp_path / "step-00000003").mkdir()
    args = [str(tmp_path / where)] + ([str(tmp_path / "out.safetensors")] * (command != "inspect"))
    done = subprocess.run(
        [sys.executable, "-m", "ddp.checkpoint", command, *args],
        cwd=REPO, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"python -m ddp.checkpoint {command}: ")
    assert "Traceback" not in done.stderr and where in lines[0]


def test_consolidate_into_an_unwritable_output_is_one_line(tmp_path, capsys):
    checkpoint.save(tmp_path / "ck", {"a": np.ones(2)}, step=1)
    assert tool(["consolidate", str(tmp_path / "ck"), str(tmp_path / "no" / "out.st")]) == 1
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "out.st" in err


def test_an_index_that_does_not_fit_leaves_no_temporary_directory(tmp_path, monkeypatch):
    checkpoint.save(tmp_path, {"a": np.ones(2)}, step=1)

    def full_disk(path, index):
        (path / "index.json").write_text('{"format": "collec')  # what fitted
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(save_module, "write_index", full_disk)
    with pytest.raises(CheckpointError, match="step 2 failed: rank 0: OSError: .*No space left"):
        checkpoint.save(tmp_path, {"a": np.ones(2)}, step=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000001"]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert checkpoint.latest(tmp_path) == tmp_path / "step-00000001"


def test_a_data_file_that_does_not_fit_leaves_no_temporary_directory(tmp_path, monkeypatch):
    def full_disk(path, tensors, metadata):
        path.write_bytes(b"half")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(save_module, "write_safetensors", full_disk)
    with pytest.raises(CheckpointError, match="rank 0: OSError: .*No space left"):
        checkpoint.save(tmp_path, {"a": np.ones(2)}, step=1)
    assert list(tmp_path.iterdir()) == []
