"""Two ranks' reduce_scatter as one exchange gives MPI's reduce_scatter's bits: ours against
raw mpi4py's Reduce_scatter_block, each op, float32, 50,000 elements a rank, standard normal
values with NaNs in every 7th element on rank 0 and every 11th on rank 1. Prints, per rank,
whether the bits agree where neither operand is a NaN, and where one is.
Run: mpiexec -n 2 python -u same_bits.py
"""

import numpy as np
from mpi4py import MPI

import collectives as col

comm = col.init(backend="mpi")
m, r, n = comm.mpi_comm, comm.rank, 50_000
inputs = [np.random.default_rng(q).standard_normal((2, n)).astype(np.float32) for q in (0, 1)]
inputs[0][:, ::7] = np.nan
inputs[1][:, ::11] = np.nan
x = inputs[r]
nan = np.isnan(inputs[0][r]) | np.isnan(inputs[1][r])  # where this rank's result meets one
said = []
for op, mpi_op in (("sum", MPI.SUM), ("prod", MPI.PROD), ("max", MPI.MAX), ("min", MPI.MIN)):
    ours = comm.reduce_scatter(x.copy(), op)
    theirs = np.empty(n, np.float32)
    m.Reduce_scatter_block(x.copy(), theirs, mpi_op)
    same = ours.view(np.uint32) == theirs.view(np.uint32)
    said.append(f"{op} {bool(same[~nan].all())}/{bool(same[nan].all())}")
print(f"{MPI.Get_library_version()[:16]} rank {r}, same bits without/with a NaN: {', '.join(said)}")
comm.close()
