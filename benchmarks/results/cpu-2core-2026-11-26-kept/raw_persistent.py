# ruff: noqa: B007, B023  (each closure is timed inside the loop that binds it)
# Raw mpi4py, no collectives: each verb blocking, non-blocking (Test in a loop) and persistent
# (Start, then Test in a loop), 8 B and 1 KiB, 2 ranks: median of 5 rounds of 10000 calls, us.
# mpiexec -n 2 python raw_persistent.py (output: raw_persistent.<mpi>.txt)
import time

import numpy as np
from mpi4py import MPI

c = MPI.COMM_WORLD
n = c.size
N = 10000


def mk(count):
    x = np.ones(count)
    y = np.empty(count)
    g = np.empty(count * n)
    calls = {
        "bcast": (lambda: c.Bcast(x, 0), lambda: c.Ibcast(x, 0), c.Bcast_init(x, 0)),
        "reduce": (
            lambda: c.Reduce(x, y, MPI.SUM, 0),
            lambda: c.Ireduce(x, y, MPI.SUM, 0),
            c.Reduce_init(x, y, MPI.SUM, 0),
        ),
        "gather": (lambda: c.Gather(x, g, 0), lambda: c.Igather(x, g, 0), c.Gather_init(x, g, 0)),
        "scatter": (
            lambda: c.Scatter(g, x, 0),
            lambda: c.Iscatter(g, x, 0),
            c.Scatter_init(g, x, 0),
        ),
        "allreduce": (
            lambda: c.Allreduce(x, y),
            lambda: c.Iallreduce(x, y),
            c.Allreduce_init(x, y),
        ),
        "allgather": (
            lambda: c.Allgather(x, g),
            lambda: c.Iallgather(x, g),
            c.Allgather_init(x, g),
        ),
    }
    return calls


def spin(r):
    while not r.Test():
        pass


def pers(p):
    p.Start()
    while not p.Test():
        pass


for count in (1, 128):
    calls = mk(count)
    for name, (blk, nb, p) in calls.items():
        fs = {"blocking": blk, "nonblocking": lambda: spin(nb()), "persistent": lambda: pers(p)}
        res = {k: [] for k in fs}
        for rnd in range(5):
            for k, f in fs.items():
                c.Barrier()
                t = time.perf_counter()
                for _ in range(N):
                    f()
                res[k].append((time.perf_counter() - t) / N * 1e6)
        p.Free()
        if c.rank == 0:
            print(
                f"{count * 8:5d}B {name:10s} "
                + "  ".join(f"{k} {sorted(v)[2]:.2f}" for k, v in res.items()),
                flush=True,
            )
