"""mpiexec -n 4 python -m benchmarks.pipeline_schedules

Measured step time of each pipeline schedule against its simulation. Every stage does real
work (NumPy matmuls: a stack of dense tanh layers), activations and gradients travel over
the communicator, and each action is timed. The per-action costs measured in the run
(median F, B, I, W over all ranks) feed ``pipeline.simulate``; the table puts the measured
step time and bubble next to the simulated ones, so the bubble of each schedule can be seen
and the simulator checked.

Options: --microbatches 8 --chunks 2 --width 256 --rows 64 --layers 4 (per rank, split
over the chunks) --steps 5 --schedules gpipe,1f1b,interleaved,zb-h1,zb-h2,interleaved-zb,zb-v,dualpipe-v --backend mpi
--arrays auto (CuPy on nccl, NumPy on mpi; ``--backend mpi --arrays cupy`` sends CuPy arrays
over MPI) --json PATH --plot PATH (measured and simulated timelines of each schedule).
On CuPy every stage's forward and backward ends with a synchronisation of the device, so that
the host-side times of the trace are the times of the device's work.
BLAS runs one thread per rank unless OMP_NUM_THREADS / OPENBLAS_NUM_THREADS say otherwise.

``python -m benchmarks.pipeline_schedules --best --ranks 4 --microbatches 8 --forward 1
--backward 2 [--weight 1] [--comm 0] [--overlap X | --saving X] [--max-activations 4] [--between-steps]``
(no MPI): the table of every schedule that ``pipeline.schedules.best`` simulated, and its
pick (by the time per step between steps, ``pipeline.period``, with --between-steps).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # ranks share the cores: no BLAS oversubscription

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

import collectives as col  # noqa: E402
import pipeline  # noqa: E402
from pipeline import schedules  # noqa: E402
from pipeline.mlp import Chain, Dense, init_weights, mse  # noqa: E402

NAMES = ("gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "interleaved-zb", "zb-v", "dualpipe-v")


def make(name: str, ranks: int, microbatches: int, chunks: int) -> pipeline.Schedule:
    return {
        "gpipe": lambda: schedules.gpipe(ranks, microbatches),
        "1f1b": lambda: schedules.one_f_one_b(ranks, microbatches),
        "interleaved": lambda: schedules.interleaved_1f1b(ranks, microbatches, chunks),
        "zb-h1": lambda: schedules.zero_bubble(ranks, microbatches),
        "zb-h2": lambda: schedules.zero_bubble_h2(ranks, microbatches),
        "interleaved-zb": lambda: schedules.interleaved_zero_bubble(ranks, microbatches, chunks),
        "zb-v": lambda: schedules.zero_bubble_v(ranks, microbatches),
        "dualpipe-v": lambda: schedules.dualpipe_v(ranks, microbatches),
    }[name]()


def synchronized(stage: pipeline.Stage, sync) -> pipeline.Stage:
    """``stage`` whose every call returns once the device has finished its work."""

    def forward(x, mb):
        y = stage.forward(x, mb)
        sync()
        return y

    def backward(dy, mb):
        dx = stage.backward(dy, mb)
        sync()
        return dx

    weight = stage.backward_weight
    if weight is None:
        return pipeline.Stage(forward, backward)

    def backward_weight(mb):
        weight(mb)
        sync()

    return pipeline.Stage(forward, backward, backward_weight)


def measure(comm, schedule: pipeline.Schedule, args, xp=np) -> dict:
    """Run ``args.steps`` timed steps (after one warmup); this rank's times and traces."""
    chunks = schedule.chunks
    per_chunk = max(1, args.layers // chunks)
    rng = np.random.default_rng(0)
    stages, layers = [], []
    for _ in range(chunks):
        sizes = [args.width] * (per_chunk + 1)
        chunk = [Dense(w, b) for w, b in init_weights(sizes, rng, xp=xp)]
        layers += chunk
        stage = Chain(chunk).stage(split=schedule.splits_backward)
        if xp is not np:
            stage = synchronized(stage, xp.cuda.get_current_stream().synchronize)
        stages.append(stage)
    xs = [
        xp.asarray(rng.standard_normal((args.rows, args.width)))
        for _ in range(schedule.microbatches)
    ]
    first, last = comm.rank == 0, comm.rank == schedule.place(schedule.stages - 1)[0]
    steps, traces = [], []
    for step in range(args.steps + 1):
        for layer in layers:
            layer.zero_grad()
        trace: list = []
        comm.barrier()
        start = time.perf_counter()
        pipeline.run(schedule, comm, stages, inputs=xs if first else None,
                     targets=xs if last else None, loss_fn=mse, trace=trace)  # fmt: skip
        comm.barrier()
        if step:  # the first step allocates buffers and exchanges headers
            steps.append(time.perf_counter() - start)
            traces.append(trace)
    return {"steps": steps, "traces": traces}


def summarize(schedule, gathered: list[dict]) -> dict:
    """Measured and simulated numbers of one schedule, from every rank's measurements."""
    costs: dict[str, list[float]] = {}
    for rank in gathered:
        for trace in rank["traces"]:
            for action, start, end in trace:
                costs.setdefault(action.kind.name, []).append(end - start)
    median = {k: statistics.median(v) for k, v in costs.items()}
    step_times = [max(r["steps"][i] for r in gathered) for i in range(len(gathered[0]["steps"]))]
    best = min(range(len(step_times)), key=step_times.__getitem__)
    measured = pipeline.from_trace(schedule, [r["traces"][best] for r in gathered])
    backward = median.get("B", median.get("I", 0.0) + median.get("W", 0.0))
    weight = median.get("W")
    if weight and "I" in median:
        # W's share of a split backward, of the backward simulated: where a schedule has
        # whole backwards too (DualPipe-V), a W timed alone can outlast a whole B
        weight = backward * weight / (median["I"] + weight)
    simulated = pipeline.simulate(schedule, median["F"], backward, weight)
    return {
        "schedule": schedule.name,
        "ranks": schedule.ranks,
        "microbatches": schedule.microbatches,
        "chunks": schedule.chunks,
        "step_ms": {"median": 1e3 * statistics.median(step_times), "min": 1e3 * min(step_times)},
        "measured": {"makespan_ms": 1e3 * measured.makespan, "bubble": measured.bubble_fraction},
        "simulated": {"makespan_ms": 1e3 * simulated.makespan, "bubble": simulated.bubble_fraction},
        "action_ms": {k: 1e3 * v for k, v in median.items()},
        "_timelines": (measured, simulated),
    }


def table(rows: list[dict]) -> str:
    lines = [
        f"{'schedule':<22} {'step ms':>8} {'(min)':>7} {'measured':>9} {'simulated':>9} "
        f"{'bubble':>7} {'sim.':>6}   action ms (median)",
    ]
    for r in rows:
        acts = " ".join(f"{k}={v:.3f}" for k, v in r["action_ms"].items())
        lines.append(
            f"{r['schedule']:<22} {r['step_ms']['median']:8.2f} {r['step_ms']['min']:7.2f} "
            f"{r['measured']['makespan_ms']:9.2f} {r['simulated']['makespan_ms']:9.2f} "
            f"{r['measured']['bubble']:7.1%} {r['simulated']['bubble']:6.1%}   {acts}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="pipeline schedules: measured vs simulated")
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=2)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--rows", type=int, default=64)
    parser.add_argument("--layers", type=int, default=4, help="dense layers per rank")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--schedules", default=",".join(NAMES))
    parser.add_argument("--backend", default="mpi")
    parser.add_argument("--arrays", default="auto", choices=("auto", "numpy", "cupy"))
    parser.add_argument("--json", metavar="PATH")
    parser.add_argument("--plot", metavar="PATH")
    parser.add_argument("--best", action="store_true", help="simulate only: pick a schedule")
    parser.add_argument("--ranks", type=int, default=4, help="with --best")
    parser.add_argument("--forward", type=float, default=1.0, help="with --best")
    parser.add_argument("--backward", type=float, default=2.0, help="with --best")
    parser.add_argument("--weight", type=float, help="with --best")
    parser.add_argument("--comm", type=float, default=0.0, help="with --best")
    parser.add_argument("--overlap", type=float, help="with --best: what a pair costs")
    parser.add_argument("--saving", type=float, help="with --best: what a pair saves")
    parser.add_argument("--max-activations", type=float, help="with --best")
    parser.add_argument("--between-steps", action="store_true", help="with --best: by period")
    args = parser.parse_args(argv)
    if args.best:
        choice = schedules.best(
            args.ranks, args.microbatches, forward=args.forward, backward=args.backward,
            weight=args.weight, comm=args.comm, max_activations=args.max_activations,
            overlap=args.overlap, saving=args.saving, between_steps=args.between_steps,
        )  # fmt: skip
        print(f"# {args.ranks} ranks, {args.microbatches} microbatches; per full stage F="
              f"{args.forward:g} B={args.backward:g} W={args.weight} comm={args.comm:g} "
              f"overlap={args.overlap} saving={args.saving}; peak act. in microbatches through a full stage")  # fmt: skip
        print(choice)
        print(f"best: {choice.schedule.name}")
        return

    comm = col.init(backend=args.backend)
    arrays = args.arrays if args.arrays != "auto" else "cupy" if comm.backend == "nccl" else "numpy"
    xp = __import__("cupy") if arrays == "cupy" else np
    rows = []
    for name in args.schedules.split(","):
        chunks = args.chunks if name.startswith("interleaved") else 1
        schedule = make(name, comm.size, args.microbatches, chunks)
        mine = measure(comm, schedule, args, xp)
        gathered = comm.mpi_comm.gather(mine, root=0)  # small: timings only
        if comm.rank == 0:
            rows.append(summarize(schedule, gathered))
    if comm.rank == 0:
        print(f"# {comm.size} ranks, {args.microbatches} microbatches of {args.rows}x{args.width}, "
              f"{args.layers} dense layers per rank, float64, backend {comm.backend}, {arrays} arrays; "
              f"step ms = wall time of a step (median, min over {args.steps}); measured = the "
              f"timeline of the fastest step; simulated = pipeline.simulate with the median "
              f"action costs")  # fmt: skip
        print(table(rows))
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"argv": sys.argv, "backend": comm.backend, "arrays": arrays, "rows": [{k: v for k, v in r.items() if k[0] != "_"} for r in rows]},
                          f, indent=1)  # fmt: skip
        if args.plot:
            from pipeline import plot

            sims, titles = [], []
            for r in rows:
                sims += [r["_timelines"][0], r["_timelines"][1]]
                titles += [f"{r['schedule']} measured", f"{r['schedule']} simulated"]
            for sim in sims:  # seconds -> ms, for the axis
                object.__setattr__(sim, "timeline", tuple(tuple(
                    pipeline.Event(e.rank, e.action, 1e3 * e.start, 1e3 * e.end) for e in row) for row in sim.timeline))  # fmt: skip
                object.__setattr__(sim, "makespan", 1e3 * sim.makespan)
            plot.timelines(sims, args.plot, titles=titles, unit=" ms")
    comm.close()


if __name__ == "__main__":
    main()
