"""What the NCCL path adds per call: ``mpiexec -n 1 python -m benchmarks.nccl_overhead``.

Times an all_reduce of ``--count`` float32 elements through a communicator on the NCCL backend
(synchronous and ``async_op=True``) and the raw ``cupy.cuda.nccl`` call on the same buffers
and the same stream, in interleaved rounds (so machine noise hits both), and prints the
medians and the time our call adds to the raw one ("added"), and to the raw one with the
same CUDA event calls our path makes around it ("over events": the library's own Python,
apart from what CuPy and CUDA cost), in wall time and in the calling thread's CPU time
("cpu": what the host thread itself spent, which leaves out the time it waited for the
interpreter lock, as it must on the emulated CuPy, whose streams are Python threads). Only
the issuing is timed: the stream is
drained after each round, outside the timing. At one rank no peer is waited for, so the
difference is the library's own cost on the host.

Where no GPU is, run it on the emulated CuPy of the tests (``PYTHONPATH=tests/emulation``):
the difference then measures the library's Python path on top of an emulated NCCL call, not
a GPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any, Callable

from mpi4py import MPI

import collectives as col


def _per_call_us(
    fn: Callable[[], Any], iterations: int, drain: Callable[[], None]
) -> tuple[float, float]:
    """Wall time and the calling thread's CPU time per call, in us."""
    drain()
    start, cpu = time.perf_counter(), time.thread_time()
    for _ in range(iterations):
        fn()
    elapsed, cpu = time.perf_counter() - start, time.thread_time() - cpu
    drain()
    return elapsed / iterations * 1e6, cpu / iterations * 1e6


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.nccl_overhead")
    parser.add_argument("-n", "--iterations", type=int, default=500)
    parser.add_argument("-r", "--rounds", type=int, default=15)
    parser.add_argument("--count", type=int, default=2, help="float32 elements (default 8 B)")
    args = parser.parse_args(argv)

    import cupy
    from cupy.cuda import nccl

    world = MPI.COMM_WORLD
    comm = col.init(backend="nccl")
    uid = world.bcast(nccl.get_unique_id() if world.rank == 0 else None, root=0)
    with cupy.cuda.Device(comm.device):
        raw = nccl.NcclCommunicator(world.size, uid, world.rank)
        x = cupy.ones(args.count, cupy.float32)
    stream = comm.stream

    def raw_call() -> None:
        raw.allReduce(x.data.ptr, x.data.ptr, x.size, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr)

    with cupy.cuda.Device(comm.device):
        ordering = cupy.cuda.Event(disable_timing=True)

    def raw_call_ordered() -> None:
        # the CUDA calls our path makes around the NCCL call: order after the caller's
        # stream (one event, recorded again for each call), record completion in a new
        # event, order the caller after it (synchronous calls)
        caller = cupy.cuda.get_current_stream()
        stream.wait_event(caller.record(ordering))
        raw_call()
        caller.wait_event(stream.record(cupy.cuda.Event(disable_timing=True)))

    cases: dict[str, Callable[[], Any]] = {
        "raw cupy.cuda.nccl allReduce": raw_call,
        "raw, with the same events": raw_call_ordered,
        "all_reduce": lambda: comm.all_reduce(x),
        "all_reduce, async_op=True": lambda: comm.all_reduce(x, async_op=True),
    }
    times: dict[str, list[float]] = {name: [] for name in cases}
    cpu_times: dict[str, list[float]] = {name: [] for name in cases}
    with cupy.cuda.Device(comm.device):
        for _ in range(args.rounds):
            for name, fn in cases.items():
                wall, cpu = _per_call_us(fn, args.iterations, stream.synchronize)
                times[name].append(wall)
                cpu_times[name].append(cpu)
    if world.rank == 0:
        medians = {name: statistics.median(t) for name, t in times.items()}
        cpu = {name: statistics.median(t) for name, t in cpu_times.items()}
        emulated = " (emulated CuPy: the Python path, not a GPU)" if getattr(
            cupy, "EMULATED", False
        ) else ""  # fmt: skip
        print(
            f"# {world.size} rank(s), {4 * args.count}-byte float32 all_reduce{emulated}, "
            f"median of {args.rounds} rounds x {args.iterations} calls"
        )
        print(
            f"{'call':<32}{'us/call':>10}{'added':>10}{'over events':>13}"
            f"{'cpu us/call':>13}{'cpu over events':>17}"
        )
        base = medians["raw cupy.cuda.nccl allReduce"]
        ordered = medians["raw, with the same events"]
        for name, value in medians.items():
            extra = cpu[name] - cpu["raw, with the same events"]
            print(
                f"{name:<32}{value:>10.2f}{value - base:>+10.2f}{value - ordered:>+13.2f}"
                f"{cpu[name]:>13.2f}{extra:>+17.2f}"
            )
    raw.destroy()
    comm.close()


if __name__ == "__main__":
    main()
