"""Cost of check mode per call: ``mpiexec -n 2 python -m benchmarks.check_mode``.

Times an 8-byte all_reduce on a plain communicator, on one with ``check=True`` and through raw
mpi4py, in interleaved rounds (so machine noise hits all three), and prints the median of
each with the added cost of check mode per call.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from mpi4py import MPI

import collectives as col


def _per_call_us(fn, comm: MPI.Comm, iterations: int) -> float:
    comm.Barrier()
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    elapsed = time.perf_counter() - start
    return comm.allreduce(elapsed, op=MPI.MAX) / iterations * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.check_mode")
    parser.add_argument("-n", "--iterations", type=int, default=2000)
    parser.add_argument("-r", "--rounds", type=int, default=15)
    args = parser.parse_args(argv)

    raw = MPI.COMM_WORLD.Dup()
    plain, checked = col.init(backend="mpi"), col.init(backend="mpi", check=True)
    x = np.ones(1, np.float64)
    cases = {
        "raw mpi4py Allreduce": lambda: raw.Allreduce(MPI.IN_PLACE, x, op=MPI.SUM),
        "all_reduce": lambda: plain.all_reduce(x),
        "all_reduce, check=True": lambda: checked.all_reduce(x),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.rounds):
        for name, fn in cases.items():
            times[name].append(_per_call_us(fn, raw, args.iterations))
    if raw.rank == 0:
        medians = {name: statistics.median(t) for name, t in times.items()}
        print(
            f"# {raw.size} ranks, 8-byte float64 all_reduce, median of {args.rounds} rounds "
            f"x {args.iterations} calls"
        )
        print(f"{'call':<26}{'us/call':>10}")
        for name, value in medians.items():
            print(f"{name:<26}{value:>10.2f}")
        cost = medians["all_reduce, check=True"] - medians["all_reduce"]
        print(f"check mode adds {cost:.2f} us per call")
    plain.close()
    checked.close()


if __name__ == "__main__":
    main()
