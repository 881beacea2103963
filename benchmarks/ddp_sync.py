"""mpiexec -n 2 python -m benchmarks.ddp_sync

How much the bucketed gradient reduction of ``ddp`` costs over the reduction itself.

The parameter list is a GPT-style transformer's (embeddings, then per layer: layer norms,
fused qkv, attention projection, MLP; sizes from ``--layers --d-model --vocab --seq``). For
each bucket cap three things are timed on the same bytes:

- ``flat``: one ``all_reduce(op="avg")`` of a single flat buffer (the floor);
- ``ddp``: ``mark_ready`` of every gradient in reverse model order, then ``finish()``
  (buckets reduced as views of their flat buffers: no copies);
- ``sync``: ``sync_gradients`` on separate gradient arrays (pack, reduce, unpack).

Rounds alternate which of them runs first; every timed call starts after a barrier and the
time of a call is the slowest rank's; the table shows the median over rounds and the ratio
to ``flat``. ``--json PATH`` writes the rows, ``--plot PATH`` draws the ratios.

Options: --layers 6 --d-model 512 --vocab 8192 --seq 512 --caps 1,5,25,100 --rounds 7
--backend auto --dtype float32; ``--tune`` first runs ``ddp.tune_bucket_cap`` (its report is
printed) and then times its choice against the default 25 MiB instead of ``--caps``.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import collectives as col
from ddp import DistributedDataParallel, tune_bucket_cap
from ddp._scalars import reduce_scalars

from ._report import library_versions


def transformer_shapes(layers: int, d: int, vocab: int, seq: int) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of a GPT-2-style decoder, in model order."""
    shapes: dict[str, tuple[int, ...]] = {"wte": (vocab, d), "wpe": (seq, d)}
    for i in range(layers):
        p = f"h{i}."
        shapes.update(
            {
                p + "ln1.w": (d,),
                p + "ln1.b": (d,),
                p + "attn.qkv.w": (d, 3 * d),
                p + "attn.qkv.b": (3 * d,),
                p + "attn.proj.w": (d, d),
                p + "attn.proj.b": (d,),
                p + "ln2.w": (d,),
                p + "ln2.b": (d,),
                p + "mlp.fc.w": (d, 4 * d),
                p + "mlp.fc.b": (4 * d,),
                p + "mlp.proj.w": (4 * d, d),
                p + "mlp.proj.b": (d,),
            }
        )
    shapes.update({"ln_f.w": (d,), "ln_f.b": (d,)})
    return shapes


def _sync_device(xp: Any) -> None:
    if xp is not np:
        xp.cuda.get_current_stream().synchronize()


def _timed(comm: Any, xp: Any, fn: Callable[[], None]) -> float:
    """Seconds of one call of ``fn``, the slowest rank's, started together after a barrier."""
    _sync_device(xp)
    comm.barrier()
    t0 = time.perf_counter()
    fn()
    _sync_device(xp)
    elapsed = time.perf_counter() - t0
    return reduce_scalars(comm, [elapsed], "max")[0]


def bench_cap(
    comm: Any, xp: Any, shapes: dict[str, tuple[int, ...]], dtype: Any, cap: float, args: Any
) -> dict[str, Any]:
    params = {k: xp.zeros(s, dtype) for k, s in shapes.items()}
    ddp = DistributedDataParallel(params, comm, bucket_cap_mb=cap, broadcast_from=None)
    nbytes = sum(b.nbytes for b in ddp.buckets)
    flat = xp.ones(nbytes // np.dtype(dtype).itemsize, dtype)
    grads = {k: xp.ones(s, dtype) for k, s in shapes.items()}
    reverse = list(reversed(shapes))

    def run_flat() -> None:
        comm.all_reduce(flat, op="avg")

    def run_ddp() -> None:
        for name in reverse:
            ddp.mark_ready(name)
        ddp.finish()

    def run_sync() -> None:
        ddp.sync_gradients(grads)

    runs = {"flat": run_flat, "ddp": run_ddp, "sync": run_sync}
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(args.warmup):
        for fn in runs.values():
            fn()
    for r in range(args.rounds):
        order = list(runs) if r % 2 == 0 else list(reversed(runs))
        for name in order:
            times[name].append(_timed(comm, xp, runs[name]))
    med = {k: statistics.median(v) for k, v in times.items()}
    return {
        "cap_mb": cap,
        "buckets": len(ddp.buckets),
        "tensors": len(shapes),
        "bytes": nbytes,
        "flat_ms": med["flat"] * 1e3,
        "ddp_ms": med["ddp"] * 1e3,
        "sync_ms": med["sync"] * 1e3,
        "ddp_ratio": med["ddp"] / med["flat"],
        "sync_ratio": med["sync"] / med["flat"],
        "ddp_min_ratio": min(times["ddp"]) / min(times["flat"]),
    }


def format_rows(rows: list[dict[str, Any]]) -> str:
    lines = [
        f"{'cap MB':>7} {'buckets':>7} {'MB':>8} {'flat ms':>9} {'ddp ms':>9} {'ratio':>6} "
        f"{'sync ms':>9} {'ratio':>6} {'best-of ratio':>13}"
    ]
    for r in rows:
        lines.append(
            f"{r['cap_mb']:7g} {r['buckets']:7d} {r['bytes'] / 2**20:8.1f} {r['flat_ms']:9.2f} "
            f"{r['ddp_ms']:9.2f} {r['ddp_ratio']:6.3f} {r['sync_ms']:9.2f} {r['sync_ratio']:6.3f} "
            f"{r['ddp_min_ratio']:13.3f}"
        )
    return "\n".join(lines)


def plot(path: str, meta: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    caps = [str(r["cap_mb"]) for r in rows]
    x = np.arange(len(rows))
    ax.bar(x - 0.2, [r["ddp_ratio"] for r in rows], 0.4, label="ddp (views, mark_ready + finish)")
    ax.bar(x + 0.2, [r["sync_ratio"] for r in rows], 0.4, label="sync_gradients (pack + unpack)")
    ax.axhline(1.0, color="k", lw=0.8)
    ax.axhline(1.05, color="r", lw=0.8, ls="--", label="goal 1.05x")
    ax.set_xticks(x, caps)
    ax.set_xlabel("bucket cap (MiB)")
    ax.set_ylabel("time / one flat all_reduce")
    ax.set_title(
        f"{meta['params_mb']:.0f} MiB of gradients, {meta['world_size']} ranks, {meta['backend']}"
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description="bucketed DDP reduction vs one flat all_reduce")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--d-model", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--caps", default="1,5,25,100", help="bucket caps in MiB")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--json", dest="json_path")
    parser.add_argument("--plot", dest="plot_path")
    parser.add_argument(
        "--tune", action="store_true",
        help="choose the cap with ddp.tune_bucket_cap, then time it against the default 25",
    )  # fmt: skip
    args = parser.parse_args(argv)

    with col.init(backend=args.backend) as comm:
        xp = comm.xp
        dtype = np.dtype(args.dtype)
        shapes = transformer_shapes(args.layers, args.d_model, args.vocab, args.seq)
        numel = sum(int(np.prod(s)) for s in shapes.values())
        meta = {
            "benchmark": "ddp_sync",
            "command": " ".join(["python -m benchmarks.ddp_sync", *argv]),
            "backend": comm.backend,
            "world_size": comm.size,
            "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
            "platform": platform.platform(),
            "versions": library_versions(comm.backend),
            "params": numel,
            "params_mb": numel * dtype.itemsize / 2**20,
            "tensors": len(shapes),
            "dtype": dtype.name,
            "rounds": args.rounds,
        }
        if comm.rank == 0:
            print(
                f"# {numel / 1e6:.1f}M parameters in {len(shapes)} tensors "
                f"({meta['params_mb']:.1f} MiB {dtype.name}), {comm.size} ranks, {comm.backend}"
            )
        caps = [float(c) for c in args.caps.split(",")]
        if args.tune:
            tuning = tune_bucket_cap(comm, {k: (s, dtype) for k, s in shapes.items()})
            meta["tuning"] = dataclasses.asdict(tuning)
            caps = sorted({25.0, tuning.cap_mb})
            if comm.rank == 0:
                print(tuning)
        rows = []
        for cap in caps:
            row = bench_cap(comm, xp, shapes, dtype, cap, args)
            rows.append(row)
            if comm.rank == 0:
                print(format_rows([row]).splitlines()[-1] if len(rows) > 1 else format_rows([row]))
        if comm.rank == 0:
            if args.json_path:
                Path(args.json_path).parent.mkdir(parents=True, exist_ok=True)
                with open(args.json_path, "w") as f:
                    json.dump({"metadata": meta, "rows": rows}, f, indent=1)
                    f.write("\n")
            if args.plot_path:
                plot(args.plot_path, meta, rows)


if __name__ == "__main__":
    main()
