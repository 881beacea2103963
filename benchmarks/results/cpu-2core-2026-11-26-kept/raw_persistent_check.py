# ruff: noqa: B007, B023  (each closure is timed inside the loop that binds it)
# Raw mpi4py: persistent collectives (Start, Test) against the blocking call on the same
# inputs, 20 rounds of random integers per count; prints the mismatches per rank.
# mpiexec -n N python raw_persistent_check.py (output: raw_persistent_check.<mpi>.txt)
import numpy as np
from mpi4py import MPI

c = MPI.COMM_WORLD
n = c.size
r = c.rank
rng = np.random.default_rng(r)
bad = 0
for count in (1, 3, 64, 1000, 8192):
    xin = np.empty(count)
    yout = np.empty(count)
    g = np.empty(count * n)
    xs = np.empty(count * n)
    reqs = {
        "bcast": c.Bcast_init(xin, 0),
        "reduce": c.Reduce_init(xin, yout, MPI.SUM, 0),
        "gather": c.Gather_init(xin, g, 0),
        "scatter": c.Scatter_init(xs, yout, 0),
        "allreduce": c.Allreduce_init(xin, yout),
        "allgather": c.Allgather_init(xin, g),
        "alltoall": c.Alltoall_init(xs, g),
        "reduce_scatter": c.Reduce_scatter_block_init(xs, yout),
        "allreduce_ip": c.Allreduce_init(MPI.IN_PLACE, xin),
    }
    for it in range(20):
        for name, p in reqs.items():
            xin[:] = rng.integers(0, 100, count)
            xs[:] = rng.integers(0, 100, count * n)
            a, b = xin.copy(), xs.copy()
            p.Start()
            while not p.Test():
                pass
            # reference with blocking
            if name == "bcast":
                ref = a.copy()
                c.Bcast(ref, 0)
                got = xin
            elif name == "reduce":
                ref = np.empty(count)
                c.Reduce(a, ref, MPI.SUM, 0)
                got = yout if r == 0 else ref
            elif name == "gather":
                ref = np.empty(count * n)
                c.Gather(a, ref, 0)
                got = g if r == 0 else ref
            elif name == "scatter":
                ref = np.empty(count)
                c.Scatter(b, ref, 0)
                got = yout
            elif name == "allreduce":
                ref = np.empty(count)
                c.Allreduce(a, ref)
                got = yout
            elif name == "allgather":
                ref = np.empty(count * n)
                c.Allgather(a, ref)
                got = g
            elif name == "alltoall":
                ref = np.empty(count * n)
                c.Alltoall(b, ref)
                got = g
            elif name == "reduce_scatter":
                ref = np.empty(count)
                c.Reduce_scatter_block(b, ref)
                got = yout
            elif name == "allreduce_ip":
                ref = a.copy()
                c.Allreduce(MPI.IN_PLACE, ref)
                got = xin
            if not np.array_equal(ref, got):
                bad += 1
                if bad < 5:
                    print(r, "BAD", name, count, it, flush=True)
    for p in reqs.values():
        p.Free()
print(r, "bad", bad, flush=True)
