"""Raw mpi4py, 2 ranks, 1 MiB of float32: MPI's reduce_scatter against the same result made
by hand as one exchange (each rank sends the half the other keeps, then MPI_Reduce_local).

Median of 7 rounds of 100 calls, us; each rank's x is (2, 131072) float32. Forms:
  in place:             Reduce_scatter_block(IN_PLACE, b) (the benchmark's in-place baseline)
  out of place:         Reduce_scatter_block(b, tmp)
  counted, out of place: Reduce_scatter(b, tmp, [count, count])
  exchange:             Sendrecv(b[peer] -> peer, tmp <- peer), then SUM.Reduce_local(tmp, b[me])
Run: mpiexec -n 2 python by_hand.py
"""

import time

import numpy as np
from mpi4py import MPI

m = MPI.COMM_WORLD.Dup()
n, me = m.size, m.rank
assert n == 2, "two ranks"
peer = 1 - me
b = np.ones((2, 131072), np.float32)
tmp = np.empty_like(b[0])
IP, SUM = MPI.IN_PLACE, MPI.SUM


def exchange():
    m.Sendrecv(b[peer], peer, 7, tmp, peer, 7)
    SUM.Reduce_local(tmp, b[me])


forms = {
    "in place": lambda: m.Reduce_scatter_block(IP, b, SUM),
    "out of place": lambda: m.Reduce_scatter_block(b, tmp, SUM),
    "counted, out of place": lambda: m.Reduce_scatter(b, tmp, [131072] * 2, SUM),
    "exchange": exchange,
}
times = {k: [] for k in forms}
for _ in range(7):
    for k, f in forms.items():
        b[...] = 1.0
        m.Barrier()
        t = time.perf_counter()
        for _ in range(100):
            f()
        times[k].append((time.perf_counter() - t) / 100 * 1e6)
if me == 0:
    base = np.median(times["in place"])
    cells = ", ".join(
        f"{k} {np.median(v):.1f} ({np.median(v) / base:.2f}x)" for k, v in times.items()
    )
    print(f"{MPI.Get_library_version().splitlines()[0][:24]}: {cells}")
m.Free()
