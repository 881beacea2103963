"""4 ranks on 2 cores: a synchronous 1 KiB all_reduce, ours with the books' ``yield_after`` as
given (seconds of polling before a waiting rank yields its core after every test; "default"
keeps the communicator's) against raw mpi4py's ``Allreduce``, in interleaved blocks.

Run: .venv/bin/mpiexec -n 4 .venv/bin/python yield_after_4ranks.py 0
"""

import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import collectives as col

comm = col.init(backend="mpi")
if sys.argv[1] != "default":
    comm._books.yield_after = float(sys.argv[1])
world = MPI.COMM_WORLD
x = np.ones(128)


def block(call, n=2000):
    """Seconds per call over ``n`` calls, all ranks starting together."""
    world.Barrier()
    start = time.perf_counter()
    for _ in range(n):
        call()
    return (time.perf_counter() - start) / n


ours, raw = [], []
for _ in range(9):
    ours.append(block(lambda: comm.all_reduce(x)))
    raw.append(block(lambda: world.Allreduce(MPI.IN_PLACE, x)))
if world.rank == 0:
    o, r = statistics.median(ours), statistics.median(raw)
    print(
        f"yield_after={sys.argv[1]}: ours {o * 1e6:.1f} us, mpi4py {r * 1e6:.1f} us, ratio {o / r:.2f}"
    )
comm.close()
