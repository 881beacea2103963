# raw mpi4py, persistent collectives, in place against out of place, 8 B a rank (float32 x2)
import time

import numpy as np
from mpi4py import MPI

m = MPI.COMM_WORLD.Dup()
n, me = m.size, m.rank
N, R = 20000, 7
IP = MPI.IN_PLACE
k = 2


def one():
    return np.ones(k, np.float32)


def whole():
    return np.ones(k * n, np.float32)


reqs = {
    "allreduce": (m.Allreduce_init(one(), one()), m.Allreduce_init(IP, one())),
    "allgather": (m.Allgather_init(one(), whole()), m.Allgather_init(IP, whole())),
    "reduce_scatter_block": (
        m.Reduce_scatter_block_init(whole(), one()),
        m.Reduce_scatter_block_init(IP, whole()),
    ),
    "alltoall": (m.Alltoall_init(whole(), whole()), m.Alltoall_init(IP, whole())),
    "reduce": (
        m.Reduce_init(one(), one(), root=0),
        m.Reduce_init(IP if me == 0 else one(), one(), root=0),
    ),
    "gather": (
        m.Gather_init(one(), whole(), root=0),
        m.Gather_init(IP if me == 0 else one(), whole(), root=0),
    ),
    "scatter": (
        m.Scatter_init(whole(), one(), root=0),
        m.Scatter_init(whole(), IP if me == 0 else one(), root=0),
    ),
}


def sw(p):
    p.Start()
    while not p.Test():
        pass


res = {}
for name, (oop, ip) in reqs.items():
    t = {"oop": [], "ip": []}
    for _ in range(R):
        for form, p in (("oop", oop), ("ip", ip)):
            m.Barrier()
            s = time.perf_counter()
            for _ in range(N):
                sw(p)
            t[form].append((time.perf_counter() - s) / N * 1e6)
    res[name] = (np.median(t["oop"]), np.median(t["ip"]))
if me == 0:
    print(MPI.Get_library_version().splitlines()[0][:30], f"{n} ranks")
    for name, (a, b) in res.items():
        print(f"  {name:22s} out of place {a:.3f} us, in place {b:.3f} us")
