# ruff: noqa: B007, B023  (each closure is timed inside the loop that binds it)
# Raw mpi4py at 4, 16 and 64 KiB, 2 ranks: all_reduce and broadcast blocking, non-blocking
# (Test in a loop) and persistent on a buffer of its own with the copies to and from it
# ("+copy", in NumPy); median of 5 rounds of 3000 calls, us. Output: raw_persistent_sizes.<mpi>.txt
import time

import numpy as np
from mpi4py import MPI

c = MPI.COMM_WORLD
n = c.size
N = 3000
for count in (512, 2048, 8192):
    x = np.ones(count)
    y = np.empty(count)
    st = np.empty(count)
    p = c.Allreduce_init(MPI.IN_PLACE, st)
    pb = c.Bcast_init(st, 0)

    def pers():
        st[:] = x
        p.Start()
        while not p.Test():
            pass
        y[:] = st

    def persb():
        st[:] = x
        pb.Start()
        while not pb.Test():
            pass
        y[:] = st

    def nb():
        r = c.Iallreduce(x, y)
        while not r.Test():
            pass

    def nbb():
        r = c.Ibcast(x, 0)
        while not r.Test():
            pass

    fs = {
        "allreduce blk": lambda: c.Allreduce(x, y),
        "nb": nb,
        "pers+copy": pers,
        "bcast blk": lambda: c.Bcast(x, 0),
        "nbb": nbb,
        "persb+copy": persb,
    }
    res = {k: [] for k in fs}
    for rnd in range(5):
        for k, f in fs.items():
            c.Barrier()
            t = time.perf_counter()
            for _ in range(N):
                f()
            res[k].append((time.perf_counter() - t) / N * 1e6)
    p.Free()
    pb.Free()
    if c.rank == 0:
        print(
            f"{count * 8:6d}B " + "  ".join(f"{k} {sorted(v)[2]:.2f}" for k, v in res.items()),
            flush=True,
        )
