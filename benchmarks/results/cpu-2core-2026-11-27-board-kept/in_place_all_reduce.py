# 8 B all_reduce (float32), ours against raw mpi4py, in place and out of place, interleaved
# rounds: median (and min) of 7 rounds of 20,000 calls, us. in_place_all_reduce.txt: before/after.
import time

import numpy as np
from mpi4py import MPI

import collectives as col

comm = col.init("mpi")
m = comm.mpi_comm
N, R = 20000, 7
x = np.ones(2, np.float32)
s = np.ones(2, np.float32)
r = np.empty(2, np.float32)
IP = MPI.IN_PLACE
SUM = MPI.SUM
forms = {
    "ours ip": lambda: comm.all_reduce(x),
    "raw ip": lambda: m.Allreduce(IP, x, SUM),
    "ours oop": lambda: comm.all_reduce(s, out=r),
    "raw oop": lambda: m.Allreduce(s, r, SUM),
}
res = {k: [] for k in forms}
for _ in range(R):
    for k, f in forms.items():
        x[:] = 1
        m.Barrier()
        t = time.perf_counter()
        for _ in range(N):
            f()
        res[k].append((time.perf_counter() - t) / N * 1e6)
if comm.rank == 0:
    print(comm.call_path)
    for k, v in res.items():
        print(f"{k:10s} {np.median(v):.3f} us (min {min(v):.3f})")
comm.close()
