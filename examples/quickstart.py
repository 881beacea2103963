"""mpiexec -n 4 python examples/quickstart.py

The quickstart of docs/getting_started.md: a few collectives, a batch of send/recv pairs, a sendrecv and a
device mesh.
Runs on NCCL with CuPy arrays when every rank has a GPU, else on MPI with NumPy arrays.
"""

import collectives as col

with col.init() as comm:  # NCCL if every rank has a GPU, else MPI
    xp = comm.xp  # the backend's array module: cupy on nccl, numpy on mpi
    x = xp.full(4, comm.rank, xp.float32)
    comm.all_reduce(x)  # in place: every rank holds 0 + 1 + ... + (size - 1)
    assert float(x[0]) == sum(range(comm.size))
    gathered = comm.all_gather(xp.array([comm.rank]))  # shape (size, 1)
    work = comm.all_reduce(x, op="avg", async_op=True)
    # ... overlap other work here ...
    work.wait()

    right, left = (comm.rank + 1) % comm.size, (comm.rank - 1) % comm.size
    received = xp.empty_like(x)
    with comm.group():  # many send/recv pairs, no deadlock
        comm.send(x, right)
        comm.recv(received, left)
    from_left = comm.sendrecv(x, right, source=left)  # one pair in one call
    assert (from_left == received).all()

    if comm.size % 2 == 0:
        with col.DeviceMesh(comm, {"dp": comm.size // 2, "tp": 2}) as mesh:
            y = xp.ones(3, xp.float32)
            mesh["tp"].all_reduce(y)  # over the 2 ranks that differ only along tp
            assert float(y[0]) == 2.0
    if comm.rank == 0:
        print(
            f"{comm.size} ranks on {comm.backend}: all_reduce -> {float(x[0])}, "
            f"all_gather -> {gathered.ravel().tolist()}"
        )
