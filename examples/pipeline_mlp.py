"""mpiexec -n 4 python examples/pipeline_mlp.py

A small MLP (NumPy, float64) cut into pipeline stages, one per rank and chunk, trained with
SGD on a synthetic regression task (a random "teacher" network to imitate). Every step runs
one schedule of ``pipeline.schedules`` over the ranks; the last stage also trains an
unsplit copy of the same model on the same data and prints both losses: they agree to
rounding, whatever the schedule.

Options: --schedule {gpipe,1f1b,interleaved,zb-h1,zb-h2,interleaved-zb,zb-v,dualpipe-v} --chunks 2 --microbatches 8
--steps 20 --lr 0.1 --dp 1 (with --dp 2 on 4 ranks: a 2-stage pipeline x 2 data-parallel
replicas, over ``col.DeviceMesh(comm, {"pp": 2, "dp": 2})``) --backend auto (the stages on
CuPy arrays on NCCL, NumPy on MPI; the unsplit reference on NumPy either way).
"""

from __future__ import annotations

import argparse

import numpy as np

import collectives as col
import pipeline
from pipeline import schedules
from pipeline.mlp import Chain, Dense, init_weights, mse

WIDTH, ROWS = 16, 8


def make_schedule(name: str, ranks: int, microbatches: int, chunks: int) -> pipeline.Schedule:
    if name == "gpipe":
        return schedules.gpipe(ranks, microbatches)
    if name == "1f1b":
        return schedules.one_f_one_b(ranks, microbatches)
    if name == "interleaved":
        return schedules.interleaved_1f1b(ranks, microbatches, chunks)
    if name == "zb-h1":
        return schedules.zero_bubble(ranks, microbatches)
    if name == "interleaved-zb":
        return schedules.interleaved_zero_bubble(ranks, microbatches, chunks)
    if name == "zb-v":
        return schedules.zero_bubble_v(ranks, microbatches)
    if name == "dualpipe-v":
        return schedules.dualpipe_v(ranks, microbatches)
    return schedules.zero_bubble_h2(ranks, microbatches)


def batches(step: int, count: int, teacher: list) -> tuple[list, list]:
    """``count`` microbatches of inputs and the teacher's outputs, the same on every rank."""
    rng = np.random.default_rng(1000 + step)
    xs = [rng.standard_normal((ROWS, WIDTH)) for _ in range(count)]
    ts = [Chain(teacher).forward(x, 0) for x in xs]
    return xs, ts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--schedule",
        default="1f1b",
        choices=[
            "gpipe",
            "1f1b",
            "interleaved",
            "zb-h1",
            "zb-h2",
            "interleaved-zb",
            "zb-v",
            "dualpipe-v",
        ],
    )
    parser.add_argument("--chunks", type=int, default=2)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--dp", type=int, default=1)
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()

    comm = col.init(backend=args.backend)
    xp = comm.xp  # the backend's array module: cupy on nccl, numpy on mpi
    mesh = col.DeviceMesh(comm, {"pp": comm.size // args.dp, "dp": args.dp})
    pp, dp, replica = mesh["pp"], mesh["dp"], mesh.coord["dp"]
    chunks = args.chunks if args.schedule.startswith("interleaved") else 1
    m = args.microbatches
    schedule = make_schedule(args.schedule, pp.size, m, chunks).validate()
    chunks = schedule.chunks  # V schedules hold two
    sim = pipeline.simulate(schedule, forward=1 / chunks, backward=2 / chunks)

    rng = np.random.default_rng(0)
    teacher = [Dense(w, b) for w, b in init_weights([WIDTH] * 4, rng)]
    weights = init_weights([WIDTH] * (schedule.stages + 1), rng)
    last = schedule.stages - 1

    def layer(s, w, b, xp=np):
        return Dense(
            xp.asarray(w.copy()), xp.asarray(b.copy()), activation=None if s == last else "tanh"
        )

    held = [schedule.stage_of(pp.rank, c) for c in range(chunks)]  # model stage per chunk
    mine = {s: layer(s, *weights[s], xp) for s in held}
    stages = [Chain([mine[s]]).stage(split=schedule.splits_backward) for s in held]
    is_first, is_last = pp.rank == 0, pp.rank == schedule.place(last)[0]
    unsplit = [layer(s, w, b) for s, (w, b) in enumerate(weights)] if is_last else []
    if comm.rank == comm.size - 1:
        print(f"{schedule.name} on {pp.size} pipeline ranks x {dp.size} replicas ({comm.backend}), {schedule.stages} stages, "
              f"{m} microbatches; simulated bubble {sim.bubble_fraction:.1%}\n{schedule.grid()}")  # fmt: skip

    for step in range(args.steps):
        xs, ts = batches(step, m * dp.size, teacher)
        mine_x, mine_t = xs[replica * m : (replica + 1) * m], ts[replica * m : (replica + 1) * m]
        for lyr in mine.values():
            lyr.zero_grad()
        losses = pipeline.run(schedule, pp, stages,
                              inputs=[xp.asarray(x) for x in mine_x] if is_first else None,
                              targets=[xp.asarray(t) for t in mine_t] if is_last else None,
                              loss_fn=lambda y, t: mse(y, t, scale=1 / m))  # fmt: skip
        for lyr in mine.values():  # data parallel: average over the replicas
            dp.all_reduce(lyr.grad_w, op="avg")
            dp.all_reduce(lyr.grad_b, op="avg")
            lyr.w -= args.lr * lyr.grad_w
            lyr.b -= args.lr * lyr.grad_b
        total = xp.full(1, float(sum(losses)) if is_last else 0.0)
        dp.all_reduce(total, op="avg")
        if is_last:  # the unsplit model, on the whole global batch
            chain, ref = Chain(unsplit), 0.0
            for lyr in unsplit:
                lyr.zero_grad()
            for k, (x, t) in enumerate(zip(xs, ts)):
                loss, dy = mse(chain.forward(x, k), t, scale=1 / (m * dp.size))
                chain.backward(dy, k)
                ref += loss
            for lyr in unsplit:
                lyr.w -= args.lr * lyr.grad_w
                lyr.b -= args.lr * lyr.grad_b
            if replica == dp.size - 1 and (step % 5 == 0 or step == args.steps - 1):
                got = float(total[0])
                print(f"step {step:3d}  pipeline loss {got:.10f}  unsplit loss {ref:.10f}  "
                      f"difference {abs(got - ref):.1e}")  # fmt: skip
    comm.close()


if __name__ == "__main__":
    main()
