"""ddp.checkpoint in one process: the block math, the format, atomicity, errors, the tools.

Multi-rank saves and loads (replicas written once, ZeRO, tensor parallel, resharding) are
in tests/spmd/test_checkpoint.py; a rank killed mid-save in tests/test_checkpoint_kill.py.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

import collectives as col
from ddp import AdamW, ZeroOptimizer, checkpoint
from ddp.checkpoint import CheckpointError, Shard
from ddp.checkpoint.__main__ import main as tool


@pytest.mark.parametrize(
    "shape", [(7,), (3, 4), (2, 3, 5), (4, 1, 3), (1, 6)], ids=lambda s: "x".join(map(str, s))
)
def test_flat_range_blocks_tile_the_range_in_order(shape):
    total = math.prod(shape)
    flat_index = np.arange(total).reshape(shape)
    rng = np.random.default_rng(len(shape))
    for _ in range(40):
        start, stop = sorted(int(v) for v in rng.integers(0, total + 1, size=2))
        seen = []
        for offsets, block in checkpoint.flat_range_blocks(shape, start, stop):
            index = tuple(slice(o, o + n) for o, n in zip(offsets, block))
            seen += flat_index[index].ravel().tolist()
        assert seen == list(range(start, stop)), (start, stop)


def test_flat_range_blocks_example():
    assert checkpoint.flat_range_blocks((3, 4), 2, 9) == [
        ((0, 2), (1, 2)),
        ((1, 0), (1, 4)),
        ((2, 0), (1, 1)),
    ]


def test_flat_space_shards_are_views_of_the_flat_shard():
    flat = np.arange(12.0)
    layout, shapes = {"w": (0, 6), "b": (6, 9)}, {"w": (2, 3), "b": (3,)}
    shards = checkpoint.flat_space_shards(flat[4:10], 4, layout, shapes)
    assert [(s.offsets, s.shape) for s in shards["w"]] == [((1, 1), (1, 2))]
    assert [(s.offsets, s.shape) for s in shards["b"]] == [((0,), (3,))]
    shards["w"][0].local[...] = -1  # a view: a load writes into the flat shard
    assert flat[4:6].tolist() == [-1.0, -1.0]


def state_of(rng):
    w = rng.standard_normal((4, 6))
    return w, {
        "w": [Shard(w[:, :2].copy(), (4, 6), (0, 0)), Shard(w[:, 2:].copy(), (4, 6), (0, 2))],
        "nested": {"b": np.arange(3, dtype=np.float32), "count": np.array(7, dtype=np.int64)},
        "step": 3,
        "rng": {"seed": 5, "position": [1, 2]},
    }


def test_save_and_load_into_other_blocks(tmp_path):
    w, state = state_of(np.random.default_rng(0))
    path = checkpoint.save(tmp_path, state, step=3)
    assert path == tmp_path / "step-00000003" and checkpoint.latest(tmp_path) == path
    rows = Shard(np.zeros((3, 6)), (4, 6), (1, 0))
    target = {
        "w": rows,
        "nested": {"b": np.zeros(3, np.float32), "count": np.zeros((), np.int64)},
        "step": None,
        "rng": None,
    }
    values = checkpoint.load(tmp_path, target)
    assert values == {"step": 3, "rng": {"seed": 5, "position": [1, 2]}}
    np.testing.assert_array_equal(rows.local, w[1:])
    np.testing.assert_array_equal(target["nested"]["b"], np.arange(3, dtype=np.float32))
    assert int(target["nested"]["count"]) == 7


def test_the_files_are_plain_safetensors_and_the_index_names_every_block(tmp_path):
    w, state = state_of(np.random.default_rng(1))
    path = checkpoint.save(tmp_path, state, step=1)
    index = json.loads((path / "index.json").read_text())
    assert index["version"] == checkpoint.VERSION and index["values"]["step"] == 3
    tensors = load_file(str(path / "rank-00000.safetensors"))
    for shard in index["tensors"]["w"]["shards"]:
        o, n = shard["offsets"], shard["shape"]
        np.testing.assert_array_equal(
            tensors[shard["key"]], w[o[0] : o[0] + n[0], o[1] : o[1] + n[1]]
        )
    assert index["tensors"]["w"]["shape"] == [4, 6]


def test_consolidate_and_inspect(tmp_path, capsys):
    w, state = state_of(np.random.default_rng(2))
    checkpoint.save(tmp_path / "ck", state, step=2)
    out = tmp_path / "all.safetensors"
    assert tool(["consolidate", str(tmp_path / "ck"), str(out)]) == 0
    full = load_file(str(out))
    np.testing.assert_array_equal(full["w"], w)
    assert int(full["nested.count"]) == 7
    tool(["inspect", str(tmp_path / "ck")])
    text = capsys.readouterr().out
    assert "w  float64  4x6  2 shards" in text and "step = 3" in text


def test_keep_removes_older_and_partial_saves_are_ignored_then_cleaned(tmp_path):
    _, state = state_of(np.random.default_rng(3))
    for step in (1, 2, 3):
        checkpoint.save(tmp_path, state, step=step, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002", "step-00000003"]
    partial = tmp_path / ".tmp-step-00000004"
    partial.mkdir()
    (partial / "rank-00000.safetensors").write_bytes(b"half a file")
    unindexed = tmp_path / "step-00000009"  # never made by save, but not complete either
    unindexed.mkdir()
    with pytest.warns(RuntimeWarning, match="step-00000009/index.json is missing"):
        assert checkpoint.latest(tmp_path) == tmp_path / "step-00000003"
    checkpoint.save(tmp_path, state, step=5)
    assert not partial.exists()
    with pytest.warns(RuntimeWarning, match="step-00000009"):
        assert checkpoint.latest(tmp_path) == tmp_path / "step-00000005"


def test_async_save_keeps_the_values_of_the_call(tmp_path):
    w = np.arange(6.0)
    handle = checkpoint.save(tmp_path, {"w": w}, step=1, async_op=True)
    w += 100  # training goes on
    assert handle.wait() == tmp_path / "step-00000001"
    target = {"w": np.zeros(6)}
    checkpoint.load(tmp_path, target)
    np.testing.assert_array_equal(target["w"], np.arange(6.0))


def test_the_next_save_completes_an_async_one(tmp_path):
    first = checkpoint.save(tmp_path, {"w": np.ones(3)}, step=1, async_op=True)
    checkpoint.save(tmp_path, {"w": np.zeros(3)}, step=2)
    assert first.is_completed() and (tmp_path / "step-00000001" / "index.json").is_file()


def errors_leave_arrays_alone(tmp_path, target, match, **kwargs):
    before = {k: v.copy() for k, v in target.items() if hasattr(v, "copy")}
    with pytest.raises(CheckpointError, match=match):
        checkpoint.load(tmp_path, target, **kwargs)
    for k, v in before.items():
        np.testing.assert_array_equal(target[k], v)


def test_load_errors_come_before_any_array_changes(tmp_path):
    checkpoint.save(tmp_path, {"a": np.ones(3), "b": np.ones((2, 2)), "n": 1}, step=1)
    target = {"a": np.zeros(3), "b": np.zeros((2, 2)), "n": None, "c": np.zeros(1)}
    errors_leave_arrays_alone(tmp_path, target, r"names missing from the checkpoint: \['c'\]")
    target = {"a": np.zeros(3), "n": None}
    errors_leave_arrays_alone(tmp_path, target, r"state does not have: \['b'\]")
    assert checkpoint.load(tmp_path, target, strict=False) == {"n": 1}
    target = {"a": np.zeros(4), "b": np.zeros((2, 2), np.float32), "n": None}
    errors_leave_arrays_alone(tmp_path, target, r"'a' has global shape \[4\] here, \[3\]")
    errors_leave_arrays_alone(tmp_path, target, r"'b' has dtype float32 here, float64")


def test_a_corrupt_file_fails_its_checksum_by_name(tmp_path):
    path = checkpoint.save(tmp_path, {"a": np.arange(100.0)}, step=1)
    data = bytearray((path / "rank-00000.safetensors").read_bytes())
    data[-3] ^= 0xFF
    (path / "rank-00000.safetensors").write_bytes(bytes(data))
    target = {"a": np.zeros(100)}
    errors_leave_arrays_alone(tmp_path, target, r"rank-00000.safetensors fails its checksum")


def test_an_index_of_a_newer_version_is_refused(tmp_path):
    path = checkpoint.save(tmp_path, {"a": np.ones(2)}, step=1)
    index = json.loads((path / "index.json").read_text())
    index["version"] = checkpoint.VERSION + 1
    (path / "index.json").write_text(json.dumps(index))
    match = f"format version {checkpoint.VERSION + 1}, newer"
    errors_leave_arrays_alone(tmp_path, {"a": np.zeros(2)}, match)


def test_no_checkpoint_at_all(tmp_path):
    with pytest.raises(CheckpointError, match="no complete checkpoint"):
        checkpoint.load(tmp_path, {"a": np.zeros(2)})


@pytest.mark.parametrize(
    "state,kwargs,match",
    [
        ({"a": np.ones(2)}, {"step": -1}, "step must be an integer >= 0"),
        ({"a": np.ones(2)}, {"step": 1, "keep": 0}, "keep must be an integer >= 1"),
        ({"a": np.ones(2, complex)}, {"step": 1}, "'a' has dtype complex128"),
        ({"a": object()}, {"step": 1}, r"state\['a'\] is a object"),
        ({"a": Shard(np.ones(2), (3,), (0,))}, {"step": 1}, "cover 2 of its 3 elements"),
    ],
)
def test_bad_state_is_an_invalid_argument(tmp_path, state, kwargs, match):
    with pytest.raises(col.InvalidArgumentError, match=match):
        checkpoint.save(tmp_path, state, **kwargs)
    assert checkpoint.latest(tmp_path) is None


def test_shard_must_fit_its_global_shape():
    with pytest.raises(col.InvalidArgumentError, match="does not fit"):
        Shard(np.ones((2, 2)), (3, 3), (2, 0))


def test_plain_optimizer_state_round_trip(tmp_path):
    rng = np.random.default_rng(4)
    params = {"w": rng.standard_normal((3, 2)), "b": rng.standard_normal(2)}
    opt, states = AdamW(lr=0.1), {}
    for _ in range(2):
        opt.step(params, {k: rng.standard_normal(v.shape) for k, v in params.items()}, states)
    state = {"params": params, "optim": checkpoint.OptimizerState(opt, params, states)}
    checkpoint.save(tmp_path, state, step=2)
    fresh = {k: np.zeros_like(v) for k, v in params.items()}
    fresh_states: dict = {}
    checkpoint.load(
        tmp_path, {"params": fresh, "optim": checkpoint.OptimizerState(opt, fresh, fresh_states)}
    )
    for name in params:
        np.testing.assert_array_equal(fresh[name], params[name])
        assert fresh_states[name]["step"] == 2
        np.testing.assert_array_equal(fresh_states[name]["exp_avg_sq"], states[name]["exp_avg_sq"])


def _trained(dtype, rng):
    """float64 values rounded to ``dtype``, with two AdamW steps' state (masters if half)."""
    params = {"w": rng.standard_normal((3, 2)).astype(dtype), "b": rng.standard_normal(2)}
    params["b"] = params["b"].astype(dtype)
    opt, states = AdamW(lr=0.1), {}
    for _ in range(2):
        grads = {k: rng.standard_normal(v.shape).astype(dtype) for k, v in params.items()}
        opt.step(params, grads, states)
    return params, opt, states


@pytest.mark.parametrize("half", ["float16", "bfloat16"])
def test_a_run_moves_to_half_precision_from_its_checkpoint(tmp_path, half):
    """fp32 -> half: each master is the saved float32 parameter itself, not its rounding."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    dtype = ml_dtypes.bfloat16 if half == "bfloat16" else np.dtype(half)
    params, opt, states = _trained(np.float32, np.random.default_rng(5))
    saved = {"model": {"params": params, "optim": checkpoint.OptimizerState(opt, params, states)}}
    checkpoint.save(tmp_path, saved, step=2)
    fresh = {k: np.zeros(v.shape, dtype) for k, v in params.items()}
    fresh_states: dict = {}
    state = {
        "model": {"params": fresh, "optim": checkpoint.OptimizerState(opt, fresh, fresh_states)}
    }
    with pytest.raises(CheckpointError, match="names missing from the checkpoint"):
        checkpoint.load(tmp_path, state)  # without cast=True the masters are not made
    checkpoint.load(tmp_path, state, cast=True)
    for name, value in params.items():
        np.testing.assert_array_equal(fresh_states[name]["master"], value)  # bit for bit
        np.testing.assert_array_equal(fresh[name], value.astype(dtype))
        np.testing.assert_array_equal(fresh_states[name]["exp_avg"], states[name]["exp_avg"])
        assert fresh_states[name]["step"] == 2


def test_a_run_leaves_half_precision_from_its_saved_masters(tmp_path):
    """bf16 -> fp32/fp64: each parameter is its saved float32 master, not the bf16 rounding."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    params, opt, states = _trained(ml_dtypes.bfloat16, np.random.default_rng(6))
    assert all(
        not np.array_equal(states[n]["master"], params[n].astype(np.float32)) for n in params
    )
    saved = {"model": {"params": params, "optim": checkpoint.OptimizerState(opt, params, states)}}
    checkpoint.save(tmp_path, saved, step=2)
    for wide in (np.float32, np.float64):
        fresh = {k: np.zeros(v.shape, wide) for k, v in params.items()}
        fresh_states: dict = {}
        optim = checkpoint.OptimizerState(opt, fresh, fresh_states)
        checkpoint.load(tmp_path, {"model": {"params": fresh, "optim": optim}}, cast=True)
        for name in params:
            np.testing.assert_array_equal(fresh[name], states[name]["master"].astype(wide))
            assert "master" not in fresh_states[name]
            np.testing.assert_array_equal(
                fresh_states[name]["exp_avg_sq"], states[name]["exp_avg_sq"]
            )


def test_zero_changes_precision_through_its_masters(tmp_path):
    """The same rule under ZeroOptimizer (one rank): fp32 -> bf16 makes each master from the
    saved parameter, bit for bit; bf16 -> fp32 takes each parameter from the saved master."""
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(7)
    values = {"w": rng.standard_normal((3, 4)), "b": rng.standard_normal(4)}

    def zero_of(comm, dtype, steps):
        params = {k: v.astype(dtype) for k, v in values.items()}
        zero = ZeroOptimizer(params, comm, AdamW(lr=0.1), stage=2)
        for _ in range(steps):
            for grad in zero.grads.values():
                grad[...] = rng.standard_normal(grad.shape).astype(dtype)
            zero.step()
        return zero

    def masters(zero):
        return {n: zero.master_shard[a:b] for n, (a, b) in zero.layout.offsets.items()}

    with col.init(backend="mpi", timeout=30) as comm:
        wide = zero_of(comm, np.float32, 2)
        checkpoint.save(tmp_path / "fp32", {"model": wide}, comm, step=2)
        half = zero_of(comm, ml_dtypes.bfloat16, 0)
        checkpoint.load(tmp_path / "fp32", {"model": half}, comm, cast=True)
        for name, master in masters(half).items():
            np.testing.assert_array_equal(master, wide.params[name].ravel())

        half = zero_of(comm, ml_dtypes.bfloat16, 2)
        checkpoint.save(tmp_path / "bf16", {"model": half}, comm, step=2)
        wide = zero_of(comm, np.float32, 0)
        checkpoint.load(tmp_path / "bf16", {"model": wide}, comm, cast=True)
        for name, master in masters(half).items():
            np.testing.assert_array_equal(wide.params[name].ravel(), master)
            assert not np.array_equal(master, half.params[name].ravel().astype(np.float32))


def test_save_replaces_a_checkpoint_of_the_same_step(tmp_path: Path):
    checkpoint.save(tmp_path, {"a": np.ones(2)}, step=1)
    checkpoint.save(tmp_path, {"a": np.full(2, 5.0)}, step=1)
    target = {"a": np.zeros(2)}
    checkpoint.load(tmp_path, target)
    assert target["a"].tolist() == [5.0, 5.0]


def test_every_listed_dtype_round_trips(tmp_path):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    names = ["bool", "uint8", "int8", "int16", "uint16", "float16", "int32", "uint32"]
    names += ["float32", "float64", "int64", "uint64"]
    state = {n: (np.arange(6) % 3).astype(n).reshape(2, 3) for n in names}
    state["bfloat16"] = np.array([1.5, -2.0, 3.25], dtype=ml_dtypes.bfloat16)
    checkpoint.save(tmp_path, state, step=1)
    target = {n: np.zeros_like(v) for n, v in state.items()}
    checkpoint.load(tmp_path, target)
    for name, value in state.items():
        assert target[name].dtype == value.dtype
        np.testing.assert_array_equal(target[name].astype(np.float64), value.astype(np.float64))


def test_optimizer_state_of_half_parameters_has_a_float32_master():
    params = {"w": np.array([0.5, 1.25], dtype=np.float16)}
    state = checkpoint.OptimizerState(AdamW(), params, {}).state_dict()
    assert state["master"]["w"].dtype == np.float32
    assert state["master"]["w"].tolist() == [0.5, 1.25] and state["step"] == 0
    assert state["exp_avg"]["w"].dtype == np.float32


@pytest.mark.parametrize(
    "saved,loaded",
    [
        ("float32", "float16"),
        ("float16", "float64"),
        ("float64", "bfloat16"),
        ("bfloat16", "float32"),
    ],
)
def test_cast_moves_floating_tensors_between_precisions(tmp_path, saved, loaded):
    ml_dtypes = pytest.importorskip("ml_dtypes")

    def dtype(name):
        return ml_dtypes.bfloat16 if name == "bfloat16" else np.dtype(name)

    values = np.array([[0.5, -1.25, 3.0], [1e-3, 7.0, -2.5]])
    w = values.astype(dtype(saved))
    blocks = [Shard(w[:, :2].copy(), (2, 3), (0, 0)), Shard(w[:, 2:].copy(), (2, 3), (0, 2))]
    checkpoint.save(tmp_path, {"w": blocks, "v": w[0].copy()}, step=1)
    target = {"w": np.zeros((2, 3), dtype(loaded)), "v": np.zeros(3, dtype(loaded))}
    with pytest.raises(CheckpointError, match=f"'w' has dtype {loaded} here, {saved}"):
        checkpoint.load(tmp_path, target)
    checkpoint.load(tmp_path, target, cast=True)
    assert target["w"].dtype == dtype(loaded)
    expected = w.astype(np.float64).astype(dtype(loaded))  # rounded once, from the saved values
    np.testing.assert_array_equal(target["w"], expected)
    np.testing.assert_array_equal(target["v"], expected[0])


def test_cast_never_converts_integers(tmp_path):
    checkpoint.save(tmp_path, {"n": np.arange(3, dtype=np.int64), "f": np.ones(2)}, step=1)
    target = {"n": np.zeros(3, np.int32), "f": np.zeros(2, np.float32)}
    errors_leave_arrays_alone(
        tmp_path,
        target,
        "'n' has dtype int32 here, int64 in the checkpoint .*never cast",
        cast=True,
    )
    target = {"n": np.zeros(3, np.float64), "f": np.zeros(2, np.float32)}
    errors_leave_arrays_alone(tmp_path, target, "'n' has dtype float64 here, int64", cast=True)
