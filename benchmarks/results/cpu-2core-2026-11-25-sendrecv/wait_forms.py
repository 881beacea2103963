"""How a rank that shares its core should wait: mpi4py's Wait against Test loops that yield the
core (os.sched_yield) after every n failed tests, 1 KiB non-blocking calls, median of the
per-call times of 3 runs of 2000 calls (us). Run with 4 ranks on 2 cores:

    mpiexec -n 4 python benchmarks/results/cpu-2core-2026-11-25-sendrecv/wait_forms.py
"""

import os
import statistics
import time

import numpy as np
from mpi4py import MPI

c = MPI.COMM_WORLD
rank, size = c.rank, c.size
x = np.ones(256, np.float32)
blocks, out = np.ones((size, 256), np.float32), np.empty((size, 256), np.float32)


def timed(call, n=2000):
    c.Barrier()
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n * 1e6


def yielding_every(n):
    def wait(request):
        tests = 0
        while not request.Test():
            tests += 1
            if tests % n == 0:
                os.sched_yield()

    return wait


POSTS = {
    "all_reduce": lambda: c.Iallreduce(MPI.IN_PLACE, x),
    "reduce": lambda: c.Ireduce(MPI.IN_PLACE if rank == 0 else x, x if rank == 0 else None, root=0),
    "all_gather": lambda: c.Iallgather(x, out),
    "all_to_all": lambda: c.Ialltoall(blocks, out),
    "broadcast": lambda: c.Ibcast(x, 0),
}
if rank == 0:
    library = MPI.Get_library_version().splitlines()[0].strip(" \0")
    print(f"# {library}, {size} ranks")
    print("# call        Wait   " + "  ".join(f"/{n:<4}" for n in (1, 4, 8, 16, 32)))
for name, post in POSTS.items():
    times = {"Wait": [timed(lambda post=post: post().Wait()) for _ in range(3)]}
    for n in (1, 4, 8, 16, 32):
        wait = yielding_every(n)
        times[n] = [timed(lambda wait=wait, post=post: wait(post())) for _ in range(3)]
    if rank == 0:
        print(f"{name:12s} " + "  ".join(f"{statistics.median(t):5.1f}" for t in times.values()))
