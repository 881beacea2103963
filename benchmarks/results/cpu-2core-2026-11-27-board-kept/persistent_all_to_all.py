# raw mpi4py, 2 ranks: Alltoall 256 B a rank, blocking and persistent, in place and not
import time

import numpy as np
from mpi4py import MPI

m = MPI.COMM_WORLD
n = m.size
N, R = 20000, 7
s = np.ones(64 * n, np.float32)
r = np.empty_like(s)
b = np.ones(64 * n, np.float32)
IP = MPI.IN_PLACE
p_oop = m.Alltoall_init(s, r)
p_ip = m.Alltoall_init(IP, b)


def start_wait(p):
    p.Start()
    while not p.Test():
        pass


forms = {
    "blocking oop": lambda: m.Alltoall(s, r),
    "blocking ip": lambda: m.Alltoall(IP, b),
    "persistent oop": lambda: start_wait(p_oop),
    "persistent ip": lambda: start_wait(p_ip),
    "ialltoall ip": lambda: m.Ialltoall(IP, b).Wait(),
}
res = {k: [] for k in forms}
for _ in range(R):
    for k, f in forms.items():
        m.Barrier()
        t = time.perf_counter()
        for _ in range(N):
            f()
        res[k].append((time.perf_counter() - t) / N * 1e6)
# correctness of the persistent in-place form
b[:] = np.repeat(np.arange(n) + 10 * m.rank, 64)
start_wait(p_ip)
ok = m.allreduce(np.array_equal(b, np.repeat(np.arange(n) * 10 + m.rank, 64)), op=MPI.LAND)
if m.rank == 0:
    print(MPI.Get_library_version().splitlines()[0][:40], "in-place persistent correct:", ok)
    for k, v in res.items():
        print(f"{k:16s} {np.median(v):.3f} us")
p_oop.Free()
p_ip.Free()
