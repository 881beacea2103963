"""mpiexec -n 4 python examples/tp_mesh.py

Data parallel x tensor parallel on a 2 x 2 ``DeviceMesh``: a two-layer MLP whose first layer
is column-parallel and second row-parallel over ``mesh["tp"]``, trained on a global batch
split over ``mesh["dp"]`` with a ZeRO optimizer (AdamW, state sharded over ``dp``). Every
rank also trains the unsharded model on the whole batch with plain AdamW, in float64; the
printed losses of the two agree to rounding.

Options: --steps 8 --batch 8 --hidden 16 --lr 0.05 (full-batch training; --batch is the
share of each data-parallel rank) --backend auto (CuPy arrays on NCCL, NumPy on MPI; the
unsharded reference runs on NumPy either way).
Also runs on 1 process (a 1 x 1 mesh) or 2 (1 x 2).
"""

from __future__ import annotations

import argparse

import numpy as np

import collectives as col
from ddp.optim import AdamW
from ddp.tensor_parallel import ColumnParallelLinear, RowParallelLinear
from ddp.zero import ZeroOptimizer

IN, OUT = 8, 4


def mesh_shape(size: int) -> dict[str, int]:
    """``{"dp": 2, "tp": 2}`` on 4 ranks; all tensor parallel below that."""
    return {"dp": 2, "tp": size // 2} if size >= 4 else {"dp": 1, "tp": size}


def init_weights(hidden: int) -> dict[str, np.ndarray]:
    """The full, unsharded weights: the same on every rank, whatever the mesh."""
    rng = np.random.default_rng(0)
    return {
        "w1": rng.standard_normal((IN, hidden)) / np.sqrt(IN),
        "b1": np.zeros(hidden),
        "w2": rng.standard_normal((hidden, OUT)) / np.sqrt(hidden),
        "b2": np.zeros(OUT),
    }


def global_batch(n: int) -> tuple[np.ndarray, np.ndarray]:
    """The training set (one full batch): targets from a fixed random teacher, plus noise."""
    rng = np.random.default_rng(100)
    x = rng.standard_normal((n, IN))
    teacher = np.random.default_rng(1).standard_normal((IN, OUT))
    return x, np.sin(x @ teacher) + 0.1 * rng.standard_normal((n, OUT))


def unsharded_step(p: dict, x: np.ndarray, t: np.ndarray) -> tuple[float, dict]:
    """Loss and gradients of mean((tanh(x w1 + b1) w2 + b2 - t)^2) on one process."""
    a = np.tanh(x @ p["w1"] + p["b1"])
    y = a @ p["w2"] + p["b2"]
    dy = 2 * (y - t) / y.size
    dh = (dy @ p["w2"].T) * (1 - a * a)
    grads = {"w1": x.T @ dh, "b1": dh.sum(0), "w2": a.T @ dy, "b2": dy.sum(0)}
    return float(np.mean((y - t) ** 2)), grads


def train(
    comm, steps: int = 8, batch: int = 8, hidden: int = 16, lr: float = 0.05
) -> tuple[list[float], list[float]]:
    """(losses of the 2D-parallel model, losses of the unsharded model), one per step."""
    mesh = col.DeviceMesh(comm, mesh_shape(comm.size))
    tp, dp, d = mesh["tp"], mesh["dp"], mesh.coord["dp"]
    xp = comm.xp  # the backend's array module: cupy on nccl, numpy on mpi
    full = init_weights(hidden)
    fc1 = ColumnParallelLinear(xp.asarray(full["w1"]), xp.asarray(full["b1"]), tp)
    fc2 = RowParallelLinear(xp.asarray(full["w2"]), xp.asarray(full["b2"]), tp)
    # ZeRO over dp, on this rank's tensor-parallel shards; the layers then train on views
    # into the optimizer's flat buffer, so each step's all-gather updates them in place.
    shards = {"w1": fc1.weight, "b1": fc1.bias, "w2": fc2.weight, "b2": fc2.bias}
    zero = ZeroOptimizer(shards, dp, AdamW(lr=lr, weight_decay=0.0))
    fc1.weight, fc1.bias = zero.params["w1"], zero.params["b1"]
    fc2.weight, fc2.bias = zero.params["w2"], zero.params["b2"]

    reference, states, plain = (
        {k: v.copy() for k, v in full.items()},
        {},
        AdamW(lr, weight_decay=0.0),
    )
    losses, reference_losses = [], []
    data = global_batch(batch * dp.size)
    for _ in range(steps):
        x, t = (xp.asarray(v[d * batch : (d + 1) * batch]) for v in data)
        a = xp.tanh(fc1.forward(x))
        y = fc2.forward(a)
        loss = xp.mean((y - t) ** 2).reshape(1)
        dp.all_reduce(loss, op="avg")  # equal local batches: the mean of means is the mean
        dh = fc2.backward(2 * (y - t) / y.size) * (1 - a * a)
        fc1.backward(dh)
        zero.zero_grad()
        zero.grads["w1"][...], zero.grads["b1"][...] = fc1.grad_weight, fc1.grad_bias
        zero.grads["w2"][...], zero.grads["b2"][...] = fc2.grad_weight, fc2.grad_bias
        zero.step()
        losses.append(float(loss[0]))

        ref_loss, grads = unsharded_step(reference, *data)
        plain.step(reference, grads, states)
        reference_losses.append(ref_loss)
    mesh.close()
    return losses, reference_losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--backend", default="auto")
    args = parser.parse_args()
    with col.init(backend=args.backend) as comm:
        losses, reference = train(comm, args.steps, args.batch, args.hidden, args.lr)
        if comm.rank == 0:
            print(f"mesh {mesh_shape(comm.size)} on {comm.size} ranks, backend {comm.backend}")
            print(f"{'step':>4}  {'loss (dp x tp)':>20}  {'loss (unsharded)':>20}  {'|diff|':>8}")
            for step, (a, b) in enumerate(zip(losses, reference)):
                print(f"{step:>4}  {a:>20.15f}  {b:>20.15f}  {abs(a - b):>8.1e}")


if __name__ == "__main__":
    main()
