"""MPI_(I)reduce_scatter_block against MPI_(I)reduce_scatter with each rank's count, as
mpi4py makes them (the calls, not ours): which form each library runs faster.

Run: mpiexec -n 2 python benchmarks/results/cpu-2core-2026-11-25-c-work/reduce_scatter_forms.py
Prints, per size a rank, microseconds a call (the mean of k calls after a barrier) of the
blocking _block and counted forms, then the non-blocking ones (each followed by Wait), twice.
"""

import time

import numpy as np
from mpi4py import MPI

c = MPI.COMM_WORLD
n = c.Get_size()


def timed(f, k: int) -> float:
    f()
    c.Barrier()
    start = time.perf_counter()
    for _ in range(k):
        f()
    return (time.perf_counter() - start) / k * 1e6


def forms(x: np.ndarray, out: np.ndarray, counts: list[int], k: int) -> list[float]:
    """The four forms' times on these buffers."""
    return [
        timed(lambda: c.Reduce_scatter_block(x, out), k),
        timed(lambda: c.Reduce_scatter(x, out, counts), k),
        timed(lambda: c.Ireduce_scatter_block(x, out).Wait(), k),
        timed(lambda: c.Ireduce_scatter(x, out, counts).Wait(), k),
    ]


for count in (1, 128, 1 << 14, 1 << 16, 1 << 17):
    x = np.ones((n, count))
    out = np.empty(count)
    k = 200 if count > 1000 else 20000
    rows = [forms(x, out, [count] * n, k) for _ in range(2)]
    if c.Get_rank() == 0:
        cells = " | ".join(" ".join(f"{v:.1f}" for v in row) for row in rows)
        print(
            f"{count * 8} B a rank: block, counted (blocking); block, counted (non-blocking): {cells}"
        )
