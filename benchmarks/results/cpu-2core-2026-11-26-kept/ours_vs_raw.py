# ruff: noqa: B007, B023  (each closure is timed inside the loop that binds it)
# 8 B all_reduce (float32), ours (comm.all_reduce) against raw mpi4py blocking, persistent and
# non-blocking calls, 7 rounds of 20000 calls, median, us. Run under mpiexec with
# COLLECTIVES_MPI_BLOCKING=1 and COLLECTIVES_MPI_PERSISTENT=1024 (kept) or 0 (blocking).
import time

import numpy as np
from mpi4py import MPI

import collectives as col

c = col.init(backend="mpi")
w = MPI.COMM_WORLD.Dup()
x = np.ones(2, np.float32)
y = np.empty_like(x)
p = w.Allreduce_init(x, y)


def pers():
    p.Start()
    while not p.Test():
        pass


fs = {
    "ours": lambda: c.all_reduce(x, out=y),
    "raw blocking": lambda: w.Allreduce(x, y),
    "raw persistent": pers,
    "raw ibcast-like Iallreduce": lambda: w.Iallreduce(x, y).Wait(),
}
N = 20000
res = {k: [] for k in fs}
for r in range(7):
    for k, f in fs.items():
        w.Barrier()
        t = time.perf_counter()
        for _ in range(N):
            f()
        res[k].append((time.perf_counter() - t) / N * 1e6)
if w.rank == 0:
    print(
        MPI.COMM_WORLD.Get_size(),
        "ranks, kept_bytes",
        c._books.kept_bytes,
        c._books.yield_after,
        {k: round(sorted(v)[3], 2) for k, v in res.items()},
    )
p.Free()
c.close()
