# ruff: noqa: B023  (each closure is timed inside the loop that binds it)
"""In-place reduce_scatter at 1 MiB, 2 ranks: ours against raw mpi4py's ways to the same result.

Ours leaves the result in x[rank] and the rest of x as it was (as NCCL's in-place form does);
MPI's in-place form leaves it in x[0] and the rest of x undefined. Raw mpi4py, sync and async:
  mpi in place:      Reduce_scatter_block(IN_PLACE, b): the result in b[0] (the benchmark's baseline)
  mpi in place+move: the same, then b[rank] = b[0]: the result where ours is, the rest of b lost
  out of place+copy: Reduce_scatter_block(b, tmp), then b[rank] = tmp: ours' result, b kept
Median of 7 rounds of 200 calls, us. Run: mpiexec -n 2 python reduce_scatter_in_place.py
"""

import time

import numpy as np
from mpi4py import MPI

import collectives as col

comm = col.init(backend="mpi")
m = comm.mpi_comm.Dup()
n, me = m.size, m.rank
b = np.ones((n, 262144 // n), np.float32)  # 1 MiB
tmp = np.empty_like(b[0])
IP, SUM = MPI.IN_PLACE, MPI.SUM


def move(x):
    if me:
        x[me] = x[0]


forms = {
    "sync": {
        "ours": lambda: comm.reduce_scatter(b, out=b[me]),
        "mpi in place": lambda: m.Reduce_scatter_block(IP, b, SUM),
        "mpi in place+move": lambda: (m.Reduce_scatter_block(IP, b, SUM), move(b)),
        "out of place+copy": lambda: (m.Reduce_scatter_block(b, tmp, SUM), b.__setitem__(me, tmp)),
    },
    "async": {
        "ours": lambda: comm.reduce_scatter(b, out=b[me], async_op=True).wait(),
        "mpi in place": lambda: m.Ireduce_scatter_block(IP, b, SUM).Wait(),
        "mpi in place+move": lambda: (m.Ireduce_scatter_block(IP, b, SUM).Wait(), move(b)),
        "out of place+copy": lambda: (
            m.Ireduce_scatter_block(b, tmp, SUM).Wait(),
            b.__setitem__(me, tmp),
        ),
    },
}
for mode, fs in forms.items():
    times = {k: [] for k in fs}
    for _ in range(7):
        for k, f in fs.items():
            b[...] = 1.0
            m.Barrier()
            t = time.perf_counter()
            for _ in range(200):
                f()
            times[k].append((time.perf_counter() - t) / 200 * 1e6)
    if me == 0:
        base = np.median(times["mpi in place"])
        cells = ", ".join(
            f"{k} {np.median(v):.1f} ({np.median(v) / base:.2f}x)" for k, v in times.items()
        )
        print(f"{MPI.Get_library_version().splitlines()[0][:24]}, {mode}: {cells}")
comm.close()
