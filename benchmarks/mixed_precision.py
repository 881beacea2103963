"""mpiexec -n 2 python -m benchmarks.mixed_precision

Bytes per parameter per rank, and the time of a step, for float32 training and for float16
parameters with float32 master weights, under DDP and ZeRO stages 1, 2 and 3 (AdamW).

Each configuration is built on a GPT-style parameter list (``benchmarks.ddp_sync``'s
shapes), takes one step (so that every lazy buffer exists), and then what it holds is
counted from the arrays themselves and set against the formula of docs/ddp.md
("Mixed precision: what it costs"), with P the padded parameter count and S = P / ranks:

| configuration | parameters | gradients | optimizer state (+ master) |
| --- | --- | --- | --- |
| DDP, float32 | 4P | 4P | 8P |
| DDP, float16 + master, reduce_dtype="float32" | 2P | 4P | 12P |
| ZeRO-1, float32 | 4P + 4S | 4P | 8S |
| ZeRO-2, float32 | 4P + 4S | 4P + 4S | 8S |
| ZeRO-3, float32 (between steps) | 4S | 4P + 4S | 8S |
| ZeRO-1, float16 + master | 2P + 2S | 2P + 4S | 12S |
| ZeRO-2, float16 + master | 2P + 2S | 2P + 2S + 4S | 12S |
| ZeRO-3, float16 + master (between steps) | 2S | 2P + 2S + 4S | 12S |

The time of a step (gradient reduction and update; ZeRO-3 gathers the parameters first) is
the median of ``--rounds``, every configuration timed in turns, and is reported as a ratio
to the float32 configuration of the same kind, timed in the same rounds.

Options: --layers 4 --d-model 256 --vocab 4096 --seq 256 --rounds 5 --json PATH
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any, Callable

import numpy as np

import collectives as col
from ddp import AdamW, DistributedDataParallel, ZeroOptimizer, state_nbytes

from .ddp_sync import transformer_shapes

KINDS = ("ddp", "zero1", "zero2", "zero3")
PRECISIONS = ("float32", "float16+master")


def formula(kind: str, precision: str, numel: int, size: int) -> dict[str, int]:
    """Bytes this rank holds by the docs' formula: parameters, gradients, state."""
    half = precision != "float32"
    p = 2 if half else 4
    if kind == "ddp":
        return {"params": p * numel, "grads": 4 * numel, "state": (12 if half else 8) * numel}
    shard = -(-numel // size)
    padded = shard * size
    stage = int(kind[-1])
    params = p * shard + (0 if stage == 3 else p * padded)
    grads = p * padded + (0 if stage == 1 else p * shard) + (4 * shard if half else 0)
    return {"params": params, "grads": grads, "state": (12 if half else 8) * shard}


class Setup:
    """One configuration: its arrays, a step, and what it holds."""

    def __init__(self, comm: Any, kind: str, precision: str, shapes: dict) -> None:
        dtype = np.float16 if precision != "float32" else np.float32
        rng = np.random.default_rng(0)
        params = {n: (rng.standard_normal(s) * 0.02).astype(dtype) for n, s in shapes.items()}
        self.kind, self.comm = kind, comm
        self.grads = {n: (rng.standard_normal(s) * 1e-3).astype(dtype) for n, s in shapes.items()}
        if kind == "ddp":
            self.params, self.states, self.opt = params, {}, AdamW(lr=1e-4)
            self.ddp = DistributedDataParallel(
                params, comm, reduce_dtype="float32" if precision != "float32" else None
            )
        else:
            self.zero = ZeroOptimizer(params, comm, AdamW(lr=1e-4), stage=int(kind[-1]))

    def step(self) -> None:
        if self.kind == "ddp":
            self.ddp.zero_grad()
            for name in reversed(list(self.grads)):
                self.ddp.grads[name][...] = self.grads[name]
                self.ddp.mark_ready(name)
            self.ddp.finish()
            self.opt.step(self.params, self.ddp.grads, self.states)
            return
        with self.zero.gathered() if self.kind == "zero3" else _nothing():
            for name, g in self.zero.grads.items():
                g[...] = self.grads[name]
            self.zero.step()

    def held(self) -> dict[str, int]:
        if self.kind == "ddp":
            return {
                "params": sum(int(p.nbytes) for p in self.params.values()),
                "grads": sum(int(b.buffer.nbytes) for b in self.ddp.buckets),
                "state": state_nbytes(self.states),
            }
        z = self.zero
        return {"params": z.param_nbytes, "grads": z.grad_nbytes, "state": z.state_nbytes}


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> bool:
        return False


def _timed(comm: Any, fn: Callable[[], None]) -> float:
    comm.barrier()
    t0 = time.perf_counter()
    fn()
    elapsed = np.array([time.perf_counter() - t0])
    comm.all_reduce(elapsed, op="max")
    return float(elapsed[0])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    if args.rounds < 1:
        raise col.InvalidArgumentError(f"mixed_precision: --rounds must be >= 1, got {args.rounds}")
    shapes = transformer_shapes(args.layers, args.d_model, args.vocab, args.seq)
    numel = sum(int(np.prod(s)) for s in shapes.values())
    with col.init(backend="mpi") as comm:
        setups = {(k, p): Setup(comm, k, p, shapes) for k in KINDS for p in PRECISIONS}
        for setup in setups.values():
            setup.step()
        times: dict[tuple[str, str], list[float]] = {key: [] for key in setups}
        order = list(setups)
        for r in range(args.rounds):
            for key in order if r % 2 == 0 else reversed(order):
                times[key].append(_timed(comm, setups[key].step))
        rows = []
        for (kind, precision), setup in setups.items():
            held, want = setup.held(), formula(kind, precision, numel, comm.size)
            median = statistics.median(times[(kind, precision)])
            base = statistics.median(times[(kind, "float32")])
            rows.append(
                {
                    "config": kind,
                    "precision": precision,
                    "ranks": comm.size,
                    "numel": numel,
                    **{f"{k}_bytes": v for k, v in held.items()},
                    "bytes_per_param": sum(held.values()) / numel,
                    "formula_per_param": sum(want.values()) / numel,
                    "matches_formula": held == want,
                    "step_ms": median * 1e3,
                    "step_vs_float32": median / base,
                }
            )
        if comm.rank == 0:
            print(
                f"{numel} parameters ({numel * 4 / 2**20:.1f} MiB in float32), {comm.size} "
                f"ranks, AdamW, median of {args.rounds} steps"
            )
            print(
                f"{'config':7} {'precision':15} {'params':>7} {'grads':>7} {'state':>7} "
                f"{'B/param':>8} {'formula':>8} {'step ms':>8} {'vs fp32':>8}"
            )
            for row in rows:
                per = {k: row[f"{k}_bytes"] / numel for k in ("params", "grads", "state")}
                print(
                    f"{row['config']:7} {row['precision']:15} {per['params']:7.2f} "
                    f"{per['grads']:7.2f} {per['state']:7.2f} {row['bytes_per_param']:8.2f} "
                    f"{row['formula_per_param']:8.2f} {row['step_ms']:8.1f} "
                    f"{row['step_vs_float32']:8.2f}"
                    + ("" if row["matches_formula"] else "  MISMATCH")
                )
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
