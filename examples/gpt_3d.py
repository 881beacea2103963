"""mpiexec -n 8 python examples/gpt_3d.py --dp 2 --tp 2 --pp 2

A decoder-only transformer (GPT) in plain arrays with a hand-written backward, trained on
the characters of the Zen of Python with data x tensor x pipeline parallelism over
``col.DeviceMesh(comm, {"pp": P, "dp": D, "tp": T})``:

- tensor parallel (Megatron): attention heads and MLP columns split over ``tp``
  (column-parallel QKV and first MLP layer, row-parallel output projections), a
  vocabulary-parallel embedding and cross-entropy, all of them the library's layers
  (``ddp.tensor_parallel``), run per microbatch with their weight gradients split off for
  the zero-bubble schedules; ``--sequence-parallel`` keeps the layer norms, residuals and
  biases on a block of the sequence per ``tp`` rank;
- pipeline parallel: the blocks cut into ``P * chunks`` stages run by ``pipeline.run``
  (``--schedule gpipe|1f1b|interleaved|zero_bubble|interleaved_zero_bubble|zero_bubble_v|
  dualpipe_v``; the V schedules hold two stages per rank, the first and the last on rank
  0); the output projection is tied to the token embedding, whose gradient is summed
  between the ranks of the first and the last stage;
- data parallel: DDP buckets over ``dp``, or ``--zero 1|2`` (ZeRO over ``dp``); AdamW;
- mixed precision: ``--precision fp16|bf16`` trains half-precision parameters through
  float32 master weights (sharded under ZeRO) and float32 gradient reduction, fp16 with a
  ``ddp.LossScaler`` over the whole mesh (``--loss-scale none`` turns it off,
  ``--inject-overflow K`` puts an infinity in the last rank's gradient at step K).

The full model is initialised from ``--seed`` on every rank, then sharded, and the global
batch does not depend on the mesh, so every mesh prints the losses of ``--dp 1 --tp 1 --pp
1`` to rounding. Rank 0 prints one line per step: ``step {i} loss {loss:.12e}``.

``--save DIR --save-every K`` writes a checkpoint every K steps (``ddp.checkpoint``, the last
2 kept); ``--resume DIR`` continues from the newest one in DIR on any mesh, ZeRO stage or
DDP, with the losses of a run that never stopped (docs/checkpoint.md), and in any
``--precision``: the float32 masters are made from, or become, the saved parameters.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import io
import math
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

import collectives as col
import pipeline
from ddp import AdamW, DistributedDataParallel, LossScaler, ZeroOptimizer, checkpoint
from ddp.tensor_parallel import (
    ColumnParallelLinear,
    RowParallelLinear,
    VocabParallelEmbedding,
    allreduce_sequence_parallel_grads,
    vocab_parallel_cross_entropy,
)
from pipeline import schedules

SCHEDULES = (
    "gpipe",
    "1f1b",
    "interleaved",
    "zero_bubble",
    "interleaved_zero_bubble",
    "zero_bubble_v",
    "dualpipe_v",
)
PRECISIONS = ("fp32", "fp16", "bf16")
VOCAB_MULTIPLE = 8  # the vocabulary is padded to this, whatever the mesh (tp must divide it)


@dataclass
class Config:
    """The command-line options (``--global-batch`` is ``global_batch``); ``vocab`` None:
    the text's characters, padded to a multiple of 8."""

    dp: int = 1
    tp: int = 1
    pp: int = 1
    schedule: str = "1f1b"
    chunks: int = 2
    microbatches: int = 4
    zero: int = 0
    sequence_parallel: bool = False
    dtype: str = "float64"
    seed: int = 0
    steps: int = 5
    global_batch: int = 8
    seq_len: int = 16
    layers: int = 2
    heads: int = 4
    hidden: int = 32
    vocab: Optional[int] = None
    lr: float = 3e-3
    precision: Optional[str] = None  # None: --dtype; else fp32, fp16 or bf16 parameters
    loss_scale: str = "dynamic"  # fp16: "dynamic" (a LossScaler) or "none"
    init_scale: float = 2.0**16
    inject_overflow: int = -1  # the step whose gradient gets an inf on the last rank
    save: Optional[str] = None  # directory of checkpoints, written every --save-every steps
    save_every: int = 0
    resume: Optional[str] = None  # a checkpoint, or a directory: its newest complete one


# -------------------------------------------------------------------- data


def corpus() -> str:
    """The Zen of Python, from the standard library (``import this`` prints it: silenced)."""
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return codecs.decode(this.s, "rot13")


def vocabulary(text: str, vocab: Optional[int]) -> tuple[dict[str, int], int]:
    """Character -> id (sorted), and the vocabulary size padded to a multiple of 8."""
    chars = sorted(set(text))
    size = -(-len(chars) // VOCAB_MULTIPLE) * VOCAB_MULTIPLE if vocab is None else vocab
    if size < len(chars):
        raise col.InvalidArgumentError(f"gpt_3d: --vocab {size}, expected >= {len(chars)}")
    return {c: i for i, c in enumerate(chars)}, size


def global_batch(tokens: np.ndarray, step: int, cfg: Config) -> np.ndarray:
    """``(global_batch, seq_len + 1)`` token windows of step ``step``, the same on every mesh."""
    rng = np.random.default_rng([cfg.seed, step])
    starts = rng.integers(0, len(tokens) - cfg.seq_len - 1, size=cfg.global_batch)
    return np.stack([tokens[s : s + cfg.seq_len + 1] for s in starts])


# -------------------------------------------------------------------- parameters


def init_full(cfg: Config, vocab: int) -> dict[str, np.ndarray]:
    """The whole model from the seed, the same on every rank. QKV columns are ordered
    (head, q|k|v, head_dim) so that a contiguous column block holds whole heads."""
    rng = np.random.default_rng(cfg.seed)
    h = cfg.hidden

    def normal(*shape, std=0.02):
        return rng.standard_normal(shape) * std

    p = {"wte": normal(vocab, h, std=0.1), "wpe": normal(cfg.seq_len, h, std=0.1)}
    for layer in range(cfg.layers):
        n = f"h{layer}."
        p[n + "ln1_g"], p[n + "ln1_b"] = np.ones(h), np.zeros(h)
        p[n + "w_qkv"], p[n + "b_qkv"] = normal(h, 3 * h, std=h**-0.5), np.zeros(3 * h)
        p[n + "w_o"], p[n + "b_o"] = normal(h, h, std=h**-0.5), np.zeros(h)
        p[n + "ln2_g"], p[n + "ln2_b"] = np.ones(h), np.zeros(h)
        p[n + "w_fc"], p[n + "b_fc"] = normal(h, 4 * h, std=h**-0.5), np.zeros(4 * h)
        p[n + "w_proj"], p[n + "b_proj"] = normal(4 * h, h, std=(4 * h) ** -0.5), np.zeros(h)
    p["lnf_g"], p["lnf_b"] = np.ones(h), np.zeros(h)
    return {k: v.astype(cfg.dtype) for k, v in p.items()}


#: how each parameter splits over tp: along its rows (0), its columns (1), or not (None)
SPLIT = {"wte": 0, "w_qkv": 1, "b_qkv": 0, "w_o": 0, "w_fc": 1, "b_fc": 0, "w_proj": 0}


def shard(name: str, full: np.ndarray, tp: int, rank: int) -> np.ndarray:
    """This tp rank's block of a parameter (a contiguous block; whole if replicated)."""
    axis = SPLIT.get(name.split(".")[-1])
    if axis is None:
        return full.copy()
    k = full.shape[axis] // tp
    index = [slice(None)] * full.ndim
    index[axis] = slice(rank * k, (rank + 1) * k)
    return np.ascontiguousarray(full[tuple(index)])


def stage_layers(layers: int, stages: int) -> list[list[int]]:
    """The blocks of every model stage: ``numpy.array_split`` order (later stages may be empty)."""
    return [[int(i) for i in part] for part in np.array_split(np.arange(layers), stages)]


# -------------------------------------------------------------------- the model


class Tape:
    """Backward closures recorded by a forward pass, run in reverse.

    Each closure maps ``dy`` to ``dx`` and appends its weight-gradient work (a thunk) to the
    list it is given: zero-bubble schedules run that list later, in their W actions.
    """

    def __init__(self, microbatch: int) -> None:
        self.microbatch = microbatch  # the key the tensor-parallel layers keep their state by
        self.backs: list[Callable[[Any, list], Any]] = []

    def push(self, back: Callable[[Any, list], Any]) -> None:
        self.backs.append(back)

    def backward(self, dy: Any, deferred: list) -> Any:
        for back in reversed(self.backs):
            dy = back(dy, deferred)
        return dy


class GPT:
    """This rank's part of the model: the stages it holds, sharded over ``tp``.

    ``params`` and ``grads`` are name -> array (the ones DDP or ZeRO hand back); every op
    looks its arrays up by name when it runs.
    """

    def __init__(self, cfg: Config, vocab: int, tp: Any, xp: Any) -> None:
        self.cfg, self.vocab, self.tp, self.xp = cfg, vocab, tp, xp
        self.sp = cfg.sequence_parallel and tp.size > 1
        self.heads = cfg.heads // tp.size
        self.head_dim = cfg.hidden // cfg.heads
        self.params: dict[str, Any] = {}
        self.grads: dict[str, Any] = {}
        seq_block = cfg.seq_len // tp.size if self.sp else cfg.seq_len
        lo = tp.rank * seq_block if self.sp else 0
        self.positions = (lo, lo + seq_block)
        k = vocab // tp.size
        self.vocab_range = (tp.rank * k, (tp.rank + 1) * k)
        self.tapes: dict[tuple[int, int], Tape] = {}
        self.deferred: dict[tuple[int, int], list] = {}
        # name -> (library layer, weight name, bias name, whether the weight is transposed)
        self.layers: dict[str, tuple[Any, str, Optional[str], bool]] = {}

    def build_layers(self, full: dict[str, np.ndarray], names: list[str]) -> None:
        """The tensor-parallel layers of the parameters in ``names`` (this rank's stages),
        from the full model: each shards its own weights, the same blocks as :func:`shard`."""
        sp, xp = self.sp, self.xp

        def arr(name: str) -> Any:
            return xp.asarray(full[name])

        for n in {name.rsplit(".", 1)[0] + "." for name in names if name.startswith("h")}:
            for w, b, kind in (("w_qkv", "b_qkv", ColumnParallelLinear), ("w_o", "b_o", RowParallelLinear),
                               ("w_fc", "b_fc", ColumnParallelLinear), ("w_proj", "b_proj", RowParallelLinear)):  # fmt: skip
                layer = kind(arr(n + w), arr(n + b), self.tp, sequence_parallel=sp)
                self.layers[n + w] = (layer, n + w, n + b, False)
        if "wpe" in names:  # the first stage: the token embedding
            embedding = VocabParallelEmbedding(arr("wte"), self.tp, sequence_parallel=sp)
            self.layers["embed"] = (embedding, "wte", None, False)
        if "lnf_g" in names:  # the last stage: the output projection, tied to wte
            head = ColumnParallelLinear(arr("wte").T, None, self.tp, sequence_parallel=sp)
            self.layers["head"] = (head, "wte", None, True)

    def tp_layer(self, key: str, x: Any, tape: Tape) -> Any:
        """Run the tensor-parallel layer ``key`` on ``x`` for the tape's microbatch, its
        weights and gradients bound to the arrays DDP or ZeRO hand out (read by name when it
        runs, like every op here; keyed gradients are added in place). Its weight gradient
        goes to ``deferred``, for the W actions of zero-bubble schedules."""
        layer, w, b, transposed = self.layers[key]
        layer.weight = self.params[w].T if transposed else self.params[w]
        layer.grad_weight = self.grads[w].T if transposed else self.grads[w]
        if b is not None:
            layer.bias, layer.grad_bias = self.params[b], self.grads[b]
        m = tape.microbatch

        def back(dy, deferred):
            dx = layer.backward(dy, m, split=True)
            deferred.append(lambda: layer.backward_weight(m))
            return dx

        tape.push(back)
        return layer.forward(x, m)

    def accumulate(self, name: str, value: Any) -> None:
        self.grads[name] += value

    # -- ops

    def layer_norm(self, x: Any, prefix: str, tape: Tape, eps: float = 1e-5) -> Any:
        xp = self.xp
        mean = x.mean(axis=-1, keepdims=True)
        inv = 1.0 / xp.sqrt(((x - mean) ** 2).mean(axis=-1, keepdims=True) + eps)
        xhat = (x - mean) * inv
        g, b = prefix + "_g", prefix + "_b"

        def back(dy, deferred):
            def weights():
                self.accumulate(g, (dy * xhat).reshape(-1, xhat.shape[-1]).sum(axis=0))
                self.accumulate(b, dy.reshape(-1, dy.shape[-1]).sum(axis=0))

            deferred.append(weights)
            d = dy * self.params[g]
            return inv * (
                d - d.mean(axis=-1, keepdims=True) - xhat * (d * xhat).mean(axis=-1, keepdims=True)
            )

        tape.push(back)
        return xhat * self.params[g] + self.params[b]

    def gelu(self, x: Any, tape: Tape) -> Any:
        xp, c = self.xp, math.sqrt(2 / math.pi)
        t = xp.tanh(c * (x + 0.044715 * x**3))

        def back(dy, _):
            return dy * (0.5 * (1 + t) + 0.5 * x * (1 - t * t) * c * (1 + 3 * 0.044715 * x * x))

        tape.push(back)
        return 0.5 * x * (1 + t)

    def attention(self, qkv: Any, tape: Tape) -> Any:
        """Causal self-attention of this rank's heads: ``(S, B, heads * 3 * d) -> (S, B, heads * d)``."""
        xp = self.xp
        s, batch, _ = qkv.shape
        h, d = self.heads, self.head_dim
        parts = qkv.reshape(s, batch, h, 3, d).transpose(3, 1, 2, 0, 4)  # (3, B, h, S, d)
        q, k, v = parts[0], parts[1], parts[2]
        scale = 1.0 / math.sqrt(d)
        scores = (q @ k.transpose(0, 1, 3, 2)) * scale
        future = xp.triu(xp.ones((s, s), dtype=bool), k=1)
        scores = xp.where(future, -xp.inf, scores)
        probs = xp.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        out = probs @ v  # (B, h, S, d)

        def back(dy, _):
            do = dy.reshape(s, batch, h, d).transpose(1, 2, 0, 3)
            dprobs = do @ v.transpose(0, 1, 3, 2)
            dv = probs.transpose(0, 1, 3, 2) @ do
            dscores = probs * (dprobs - (dprobs * probs).sum(axis=-1, keepdims=True)) * scale
            dq, dk = dscores @ k, dscores.transpose(0, 1, 3, 2) @ q
            dparts = xp.stack([dq, dk, dv])  # (3, B, h, S, d)
            return dparts.transpose(3, 1, 2, 0, 4).reshape(s, batch, h * 3 * d)

        tape.push(back)
        return out.transpose(2, 0, 1, 3).reshape(s, batch, h * d)

    def residual(self, x: Any, branch: Callable[[Any, Tape], Any], tape: Tape) -> Any:
        inner = Tape(tape.microbatch)
        y = x + branch(x, inner)
        tape.push(lambda dy, deferred: dy + inner.backward(dy, deferred))
        return y

    # -- the model's parts

    def embed(self, ids: Any, tape: Tape) -> Any:
        """Token (vocab-parallel) plus position embeddings of ``ids`` ``(S, B)``."""
        x = self.tp_layer("embed", ids, tape)
        p0, p1 = self.positions

        def back(dy, deferred):
            def weights():
                self.grads["wpe"][p0:p1] += dy.sum(axis=1)

            deferred.append(weights)
            return dy

        tape.push(back)
        return x + self.params["wpe"][p0:p1, None, :]

    def block(self, x: Any, layer: int, tape: Tape) -> Any:
        n = f"h{layer}."

        def attention(x, t):
            a = self.tp_layer(n + "w_qkv", self.layer_norm(x, n + "ln1", t), t)
            return self.tp_layer(n + "w_o", self.attention(a, t), t)

        def mlp(x, t):
            a = self.tp_layer(n + "w_fc", self.layer_norm(x, n + "ln2", t), t)
            return self.tp_layer(n + "w_proj", self.gelu(a, t), t)

        return self.residual(self.residual(x, attention, tape), mlp, tape)

    def head(self, x: Any, tape: Tape) -> Any:
        """Final layer norm and the output projection tied to ``wte``: this rank's logits."""
        return self.tp_layer("head", self.layer_norm(x, "lnf", tape), tape)

    # -- pipeline stages

    def stage(self, index: int, stages: int, split: bool) -> pipeline.Stage:
        """Model stage ``index`` of ``stages`` as a :class:`pipeline.Stage`."""
        layers = stage_layers(self.cfg.layers, stages)[index]
        first, last = index == 0, index == stages - 1

        def forward(x, m):
            tape = Tape(m)
            if first:
                x = self.embed(x, tape)
            else:
                x = x.copy()  # the runtime reuses its receive buffers
            for layer in layers:
                x = self.block(x, layer, tape)
            if last:
                x = self.head(x, tape)
            self.tapes[(index, m)] = tape
            return x

        def backward(dy, m):
            deferred: list = []
            dx = self.tapes.pop((index, m)).backward(dy, deferred)
            if split:
                self.deferred[(index, m)] = deferred
            else:
                for work in deferred:
                    work()
            return None if first else dx

        def backward_weight(m):
            for work in self.deferred.pop((index, m)):
                work()

        return pipeline.Stage(forward, backward, backward_weight if split else None)

    def sequence_parallel_names(self) -> list[str]:
        """Replicated parameters whose gradients are partial over tp under sequence parallel
        (not the row-parallel layers' biases: those sum the all-gathered gradient)."""
        complete = ("b_o", "b_proj")
        return [n for n in self.params if SPLIT.get(n.split(".")[-1]) is None
                and n.split(".")[-1] not in complete]  # fmt: skip


# -------------------------------------------------------------------- precision


def param_dtype(cfg: Config, xp: Any) -> Any:
    """The parameters' dtype: ``--dtype``, or that of ``--precision``."""
    if cfg.precision is None:
        return np.dtype(cfg.dtype)
    if cfg.precision == "bf16":
        if xp is not np:
            raise col.InvalidArgumentError(
                "gpt_3d: --precision bf16 needs NumPy arrays (ml_dtypes); CuPy has no bfloat16 "
                "arithmetic"
            )
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(np.float16 if cfg.precision == "fp16" else np.float32)


def make_scaler(cfg: Config, comm: Any) -> LossScaler:
    """A loss scaler over the whole mesh for fp16; a disabled one (scale 1) otherwise."""
    enabled = cfg.precision == "fp16" and cfg.loss_scale == "dynamic"
    return LossScaler(comm, init_scale=cfg.init_scale, enabled=enabled)


def scaled_loss_fn(tp: Any, microbatches: int, scaler: LossScaler) -> Callable:
    """Cross-entropy in float32 at least (half logits are widened), its gradient scaled by
    ``scaler.scale / microbatches`` and given back in the logits' dtype."""

    def loss_fn(logits: Any, target: Any) -> tuple[Any, Any]:
        wide = logits if logits.dtype.itemsize >= 4 else logits.astype(np.float32)
        loss, dlogits = vocab_parallel_cross_entropy(wide, target, tp)
        dlogits = dlogits / microbatches
        if scaler.scale != 1.0:
            dlogits *= scaler.scale
        return loss, dlogits.astype(logits.dtype, copy=False)

    return loss_fn


# -------------------------------------------------------------------- training


def make_schedule(cfg: Config) -> pipeline.Schedule:
    if cfg.schedule == "gpipe":
        return schedules.gpipe(cfg.pp, cfg.microbatches)
    if cfg.schedule == "1f1b":
        return schedules.one_f_one_b(cfg.pp, cfg.microbatches)
    if cfg.schedule == "interleaved":
        return schedules.interleaved_1f1b(cfg.pp, cfg.microbatches, cfg.chunks)
    if cfg.schedule == "interleaved_zero_bubble":
        return schedules.interleaved_zero_bubble(cfg.pp, cfg.microbatches, cfg.chunks)
    if cfg.schedule == "zero_bubble_v":
        return schedules.zero_bubble_v(cfg.pp, cfg.microbatches)
    if cfg.schedule == "dualpipe_v":
        return schedules.dualpipe_v(cfg.pp, cfg.microbatches)
    return schedules.zero_bubble(cfg.pp, cfg.microbatches)


def check(cfg: Config, size: int, vocab: int) -> None:
    """Bad options fail here, on every rank, before anything communicates."""
    problems = []
    if cfg.dp * cfg.tp * cfg.pp != size:
        problems.append(f"dp*tp*pp = {cfg.dp * cfg.tp * cfg.pp}, expected the {size} ranks")
    if cfg.schedule not in SCHEDULES:
        problems.append(f"--schedule {cfg.schedule}, expected one of {SCHEDULES}")
    else:
        try:
            stages = make_schedule(cfg).stages
        except (ValueError, col.InvalidArgumentError) as e:
            problems.append(str(e))
        else:  # the blocks fill the first stages: a middle stage left empty has no parameters
            if cfg.layers < stages - 1:
                problems.append(
                    f"--layers {cfg.layers}, expected at least {stages - 1} for {stages} "
                    "pipeline stages (every stage but the last holds a block)"
                )
    if cfg.global_batch % (cfg.dp * cfg.microbatches):
        problems.append(
            f"--global-batch {cfg.global_batch}, expected a multiple of dp * microbatches"
        )
    if cfg.heads % cfg.tp or cfg.hidden % cfg.heads or vocab % cfg.tp:
        problems.append("tp must divide --heads and the vocabulary, --heads must divide --hidden")
    if cfg.sequence_parallel and cfg.seq_len % cfg.tp:
        problems.append(
            f"--seq-len {cfg.seq_len}, expected a multiple of tp with --sequence-parallel"
        )
    if cfg.zero not in (0, 1, 2):
        problems.append(f"--zero {cfg.zero}, expected 0, 1 or 2")
    if cfg.precision not in (None, *PRECISIONS):
        problems.append(f"--precision {cfg.precision}, expected one of {PRECISIONS}")
    if cfg.loss_scale not in ("dynamic", "none"):
        problems.append(f"--loss-scale {cfg.loss_scale}, expected dynamic or none")
    if cfg.inject_overflow >= 0 and (cfg.precision, cfg.loss_scale) != ("fp16", "dynamic"):
        problems.append("--inject-overflow needs the loss scaler: --precision fp16")
    if cfg.save_every < 0 or (cfg.save_every > 0) != (cfg.save is not None):
        problems.append("--save DIR and --save-every K > 0 go together")
    if problems:
        raise col.InvalidArgumentError("gpt_3d: " + "; ".join(problems))


def placements(names: list[str], full: dict[str, np.ndarray], tp: int, rank: int) -> dict:
    """Where this tp rank's block of each split parameter sits: name -> (global shape, offsets)."""
    out = {}
    for name in names:
        axis = SPLIT.get(name.split(".")[-1])
        if axis is not None:
            offsets = [0] * full[name].ndim
            offsets[axis] = rank * (full[name].shape[axis] // tp)
            out[name] = (full[name].shape, tuple(offsets))
    return out


def training_state(
    trainer: Any, optimizer: Any, states: dict, params: dict, where: dict, **more: Any
) -> dict:
    """The checkpointed state by global name: the same names under ZeRO and under DDP
    (``model.params.*``, ``model.optim.*``), whatever the mesh; ``more``: other stateful
    objects (a loss scaler) by name."""
    if isinstance(trainer, ZeroOptimizer):
        return {"model": checkpoint.Placed(trainer, where), **more}
    model = {
        "params": checkpoint.Placed(trainer, where),
        "optim": checkpoint.OptimizerState(optimizer, params, states, where),
    }
    return {"model": model, **more}


def train(
    comm: Any,
    cfg: Config,
    xp: Any = np,
    report: Optional[Callable[[int, float], None]] = None,
    observe: Optional[Callable[[int, dict], None]] = None,
) -> list[float]:
    """Train ``cfg.steps`` steps on ``comm`` (``dp * tp * pp`` ranks); the loss of every step.

    ``xp``: the array module (CuPy on the NCCL backend); ``report(step, loss)`` is called on
    every rank after every step; ``observe(step, info)`` after the gradients are reduced and
    unscaled, before the update, with ``info``: ``scale`` (the loss scale of the step),
    ``finite`` (False: every rank skips the step), ``grads`` (name -> the reduced, unscaled
    gradients this rank holds, float32 for half precision; ``{"shard": ...}`` under ZeRO),
    ``params`` and ``scaler``. Example::

        losses = train(comm, Config(dp=2, tp=2, pp=2, schedule="interleaved"))
    """
    text = corpus()
    chars, vocab = vocabulary(text, cfg.vocab)
    check(cfg, comm.size, vocab)
    tokens = np.array([chars[c] for c in text], dtype=np.int64)
    schedule = make_schedule(cfg).validate()
    mesh = col.DeviceMesh(comm, {"pp": cfg.pp, "dp": cfg.dp, "tp": cfg.tp})
    pp, dp, tp = mesh["pp"], mesh["dp"], mesh["tp"]
    stages, m = schedule.stages, cfg.microbatches

    model = GPT(cfg, vocab, tp, xp)
    mine = [schedule.stage_of(pp.rank, c) for c in range(schedule.chunks)]
    full = init_full(cfg, vocab)
    names = ["wte", "wpe"] if 0 in mine else []
    for s in mine:
        held = tuple(f"h{i}." for i in stage_layers(cfg.layers, stages)[s])
        names += [n for n in full if n.startswith(held)]
    if stages - 1 in mine:
        names += ["lnf_g", "lnf_b"] + ([] if "wte" in names else ["wte"])
    dtype = param_dtype(cfg, xp)
    params = {n: xp.asarray(shard(n, full[n], tp.size, tp.rank).astype(dtype)) for n in names}
    model.build_layers(full, names)
    optimizer = AdamW(lr=cfg.lr, weight_decay=0.01)
    scaler = make_scaler(cfg, comm)
    states: dict = {}
    if cfg.zero:
        zero = ZeroOptimizer(params, dp, optimizer, stage=cfg.zero, broadcast_from=None)
        model.params, model.grads = zero.params, zero.grads
    else:
        # half-precision gradients are reduced (and unscaled) in float32
        reduce_dtype = "float32" if dtype.itemsize == 2 else None
        ddp = DistributedDataParallel(params, dp, broadcast_from=None, reduce_dtype=reduce_dtype)
        model.params, model.grads = params, {n: xp.zeros_like(p) for n, p in params.items()}
    where = placements(names, full, tp.size, tp.rank)
    state = training_state(
        zero if cfg.zero else ddp, optimizer, states, params, where, scaler=scaler
    )
    start = 0
    if cfg.resume is not None:
        start = int(checkpoint.load(cfg.resume, {**state, "step": 0}, comm, cast=True)["step"])
    chunks = [model.stage(s, stages, schedule.splits_backward) for s in mine]
    # the tied embedding lives on the first stage (rank 0) and on the last (rank 0 in a V)
    last_rank = schedule.place(stages - 1)[0]
    tied = pipeline.tied_group(pp, (0, last_rank))
    is_first, is_last = pp.rank == 0, pp.rank == last_rank
    rows = cfg.global_batch // (dp.size * m)

    losses = []
    for step in range(start, cfg.steps):
        batch = global_batch(tokens, step, cfg)
        batch = batch[dp.rank * rows * m : (dp.rank + 1) * rows * m]
        windows = [xp.asarray(batch[i * rows : (i + 1) * rows].T.copy()) for i in range(m)]
        for g in model.grads.values():
            g[...] = 0

        loss_fn = scaled_loss_fn(tp, m, scaler)
        out = pipeline.run(
            schedule,
            pp,
            chunks,
            inputs=[w[:-1] for w in windows] if is_first else None,
            targets=[w[1:] for w in windows] if is_last else None,
            loss_fn=loss_fn,
        )
        if "wte" in model.grads:
            pipeline.reduce_tied(tied, [model.grads["wte"]])
        if model.sp:
            sp_grads = [model.grads[n] for n in model.sequence_parallel_names()]
            allreduce_sequence_parallel_grads(sp_grads, tp)
        if cfg.zero:
            reduced = {"shard": zero.reduce_grads()}
        else:
            ddp.sync_gradients(model.grads)
            reduced = ddp.grads
        if step == cfg.inject_overflow and comm.rank == comm.size - 1:
            next(iter(reduced.values())).reshape(-1)[:1] = np.inf
        scale = scaler.scale
        finite = scaler.unscale(reduced)  # False on every rank if any rank overflowed
        if observe is not None:
            info = {"scale": scale, "finite": finite, "grads": reduced, "scaler": scaler}
            observe(step, {**info, "params": model.params})
        if finite:
            if cfg.zero:
                zero.apply_update()
            else:
                optimizer.step(model.params, ddp.grads, states)
        scaler.update()
        total = xp.asarray([sum(float(v) for v in out) / m if is_last else 0.0])
        dp.all_reduce(total, op="avg")
        pp.broadcast(total, root=last_rank)
        losses.append(float(total[0]))
        if report is not None:
            report(step, losses[-1])
        if cfg.save is not None and (step + 1) % cfg.save_every == 0:
            # the step to resume from is the data position too: batches depend on it alone
            checkpoint.save(cfg.save, {**state, "step": step + 1}, comm, step=step + 1, keep=2)
    if tied is not None:
        tied.close()
    mesh.close()
    return losses


def parse(argv: Optional[list[str]] = None) -> tuple[Config, str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = Config()
    for field, value in vars(defaults).items():
        flag = "--" + field.replace("_", "-")
        if field == "sequence_parallel":
            parser.add_argument(flag, action="store_true")
        elif field == "vocab":
            parser.add_argument(flag, type=int, default=None)
        elif field == "precision":
            parser.add_argument(flag, default=None, choices=PRECISIONS)
        elif field in ("save", "resume"):
            parser.add_argument(flag, default=None, metavar="DIR")
        else:
            choices = {
                "schedule": SCHEDULES,
                "dtype": ("float32", "float64"),
                "zero": (0, 1, 2),
                "loss_scale": ("dynamic", "none"),
            }
            parser.add_argument(flag, type=type(value), default=value, choices=choices.get(field))
    parser.add_argument("--backend", default="auto")
    args = vars(parser.parse_args(argv))
    backend = args.pop("backend")
    return Config(**args), backend


def main() -> None:
    cfg, backend = parse()
    with col.init(backend=backend) as comm:
        xp = comm.xp

        seen: dict = {}

        def observe(step: int, info: dict) -> None:
            seen.update(info)

        def report(step: int, loss: float) -> None:
            if comm.rank == 0:
                extra = ""
                if cfg.precision is not None:
                    extra = f" scale {seen['scale']:g}" + ("" if seen["finite"] else " skipped")
                print(f"step {step} loss {loss:.12e}{extra}", flush=True)

        train(comm, cfg, xp, report, observe)


if __name__ == "__main__":
    main()
