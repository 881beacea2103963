"""nccl-tests for the collectives layer: time and check one collective over a size sweep.

Run it (the table goes to rank 0's stdout)::

    mpiexec -n 4 python -m benchmarks.collective --op all_reduce -b 8 -e 128M -f 2
    mpiexec -n 2 python -m benchmarks.collective -b 8 -e 16M -f 4 --baseline mpi4py \\
        --json out.json --plot out.png

Each size: every form of the call (out of place, in place) is run once on fresh data and
its result compared element by element with a NumPy reference (``#wrong``); then, after
``-w`` warm-up calls, ``-n`` calls are timed between a barrier and a synchronisation of the
device, and the per-call time is averaged over ranks. With ``--baseline``, the raw library
runs on the same buffers in the same process, its timed blocks interleaved with ours
(``-R`` rounds, alternating which goes first), and each time reported is the median (or,
with ``--stat min``, the best) of the rounds.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

from collectives import InvalidArgumentError

from . import _data, _report, _table
from ._baselines import BASELINES, make_baseline
from ._busbw import OPS, REDUCING, ROOTED, bandwidths, counts, row_bytes
from ._case import Case
from ._ours import Ours
from ._sizes import parse_size, size_sweep


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parser() -> argparse.ArgumentParser:
    """The command line, with nccl-tests' flag names."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.collective",
        description="Time and check a collective over a sweep of sizes, as nccl-tests does.",
    )
    p.add_argument("--op", default="all_reduce", choices=OPS, help="collective (all_reduce)")
    p.add_argument("-b", "--minbytes", type=_size_arg, default=8, help="min size, e.g. 8, 128K")
    p.add_argument("-e", "--maxbytes", type=_size_arg, default=32 << 20, help="max size (32M)")
    p.add_argument("-f", "--stepfactor", type=int, default=None, help="size factor (2)")
    p.add_argument("-i", "--stepbytes", type=_size_arg, default=None, help="size increment")
    p.add_argument("-o", "--op-reduce", dest="redop", default="sum", choices=_data.REDOPS)
    p.add_argument("-d", "--datatype", dest="dtype", default="float32", choices=_data.DTYPES)
    p.add_argument("-n", "--iters", type=int, default=20, help="timed calls per block (20)")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="warm-up calls (5)")
    p.add_argument("-c", "--check", type=int, default=1, choices=(0, 1), help="check (1)")
    p.add_argument("-r", "--root", type=int, default=0, help="root of rooted ops (0)")
    p.add_argument("--backend", default="auto", choices=("auto", "mpi", "nccl"))
    p.add_argument(
        "--algorithm", default="flat", choices=("flat", "hierarchical"),
        help="hierarchical: all_reduce, reduce_scatter, all_gather through col.hierarchical "
        "(nodes: the shared-memory split, or COLLECTIVES_RANKS_PER_NODE)",
    )  # fmt: skip
    p.add_argument(
        "--baseline", default=None, choices=(*BASELINES, "flat"),
        help="raw library to compare (flat: this library's flat calls, for --algorithm)",
    )  # fmt: skip
    p.add_argument(
        "-R", "--rounds", type=int, default=None,
        help="timed blocks per size and form (1; 5 with --baseline)",
    )  # fmt: skip
    p.add_argument("--stat", default="median", choices=("median", "min"), help="over rounds")
    p.add_argument("--json", default=None, metavar="PATH", help="write rows + metadata")
    p.add_argument("--plot", default=None, metavar="PATH", help="draw busbw vs size (PNG)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parsed flags, with the sweep resolved into ``args.sizes``; bad values raise."""
    args = parser().parse_args(argv)
    args.sizes = size_sweep(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes)
    if args.rounds is None:
        args.rounds = 5 if args.baseline else 1
    for flag, value, least in (("-n", args.iters, 1), ("-w", args.warmup_iters, 0),
                               ("-R", args.rounds, 1)):  # fmt: skip
        if value < least:
            raise InvalidArgumentError(f"benchmark: {flag} must be >= {least}, got {value}")
    return args


def _synchronizer(xp: Any) -> Callable[[], None]:
    """Waits for the device (CuPy) so that host clocks bracket finished work; NumPy: no-op."""
    if xp is np:
        return lambda: None
    return xp.cuda.Device().synchronize


def _time_block(call: Callable[[], Any], iters: int, sync: Callable[[], None], barrier) -> float:
    """Seconds per call over ``iters`` back-to-back calls, started together on all ranks."""
    sync()
    barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    sync()
    return (time.perf_counter() - start) / iters


def _cell(op: str, count: int, dtype: np.dtype, size: int, seconds: float, wrong: int | None):
    algbw, busbw = bandwidths(op, count, dtype.itemsize, size, seconds)
    return {"time_us": seconds * 1e6, "algbw": algbw, "busbw": busbw, "wrong": wrong}


def measure_size(
    comm: Any, args: argparse.Namespace, nbytes: int, runners: list[Any], mpi: Any, xp: Any
) -> dict[str, Any] | None:
    """One row of the table (None when ``nbytes`` holds no element per rank)."""
    from mpi4py import MPI

    op, dtype, n = args.op, np.dtype(args.dtype), comm.size
    c = counts(op, nbytes, dtype.itemsize, n)
    if c.count == 0:
        return None
    sync = _synchronizer(xp)
    # ours and the baseline share these buffers: same memory, same pages, same cache state
    cases = {
        p: Case(op, p == "in_place", args.redop, dtype, c.count, args.root, comm.rank, n, xp)
        for p in _table.PLACEMENTS
    }
    # (runner index, placement) -> (call, result), for the forms each runner has
    built = {
        (k, p): b
        for p in _table.PLACEMENTS
        for k, runner in enumerate(runners)
        if (b := runner.build(cases[p])) is not None
    }
    wrong = _check_and_warm_up(built, cases, args, sync)
    seconds = _time_rounds(built, args, sync, mpi.Barrier)
    mpi.Allreduce(MPI.IN_PLACE, seconds, MPI.SUM)
    mpi.Allreduce(MPI.IN_PLACE, wrong, MPI.SUM)
    seconds /= n  # the mean over ranks, as nccl-tests reports
    pick = statistics.median if args.stat == "median" else min
    cells = {
        key: _cell(op, c.count, dtype, n, pick(seconds[:, j].tolist()),
                   int(wrong[j]) if args.check else None)
        for j, key in enumerate(built)
    }  # fmt: skip
    row: dict[str, Any] = {
        "size": row_bytes(c, dtype.itemsize),
        "count": c.count,
        "type": dtype.name,
        "redop": args.redop if op in REDUCING else "none",
        "root": args.root if op in ROOTED else -1,
    }
    for p in _table.PLACEMENTS:
        row[p] = cells.get((0, p))
    if len(runners) > 1:
        row["baseline"] = {"name": runners[1].name}
        row["ratio"] = {}
        for p in _table.PLACEMENTS:
            ours, base = cells.get((0, p)), cells.get((1, p))
            row["baseline"][p] = base
            row["ratio"][p] = (
                ours["time_us"] / base["time_us"]
                if ours is not None and base is not None and base["time_us"] > 0
                else None
            )
    return row


def _check_and_warm_up(built: dict, cases: dict, args: argparse.Namespace, sync) -> np.ndarray:
    """Run each form once on fresh data and count wrong elements; then the warm-up calls."""
    wrong = np.zeros(len(built), np.int64)
    for j, ((_, p), (call, result)) in enumerate(built.items()):
        cases[p].reset()
        sync()
        call()
        sync()
        if args.check:
            wrong[j] = _data.count_wrong(result(), cases[p].expected())
        for _ in range(args.warmup_iters):
            call()
        sync()
    return wrong


def _time_rounds(built: dict, args: argparse.Namespace, sync, barrier) -> np.ndarray:
    """Seconds per call, (rounds, forms): ours and the baseline alternate, block by block."""
    keys = list(built)
    seconds = np.zeros((args.rounds, len(keys)))
    for r in range(args.rounds):
        for p in _table.PLACEMENTS:
            js = [j for j, key in enumerate(keys) if key[1] == p]
            # odd rounds run the baseline first, so that neither side always follows the other
            for j in js if r % 2 == 0 else reversed(js):
                seconds[r, j] = _time_block(built[keys[j]][0], args.iters, sync, barrier)
    return seconds


def run(
    comm: Any,
    args: argparse.Namespace,
    baseline: Any = None,
    emit: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """The whole sweep; ``emit`` gets the table line by line (pass a no-op off rank 0)."""
    if not 0 <= args.root < comm.size:
        raise InvalidArgumentError(
            f"benchmark: root (-r) must be in [0, {comm.size}), got {args.root}"
        )
    xp = np if comm.backend == "mpi" else _cupy()
    runners = [Ours(comm)] + ([baseline] if baseline is not None else [])
    mpi = comm.mpi_comm.Dup()  # our own barrier and reductions, apart from what is timed
    try:
        emit(_preamble(comm, args, mpi))
        emit(_table.header(baseline.name if baseline is not None else None))
        rows = []
        for nbytes in args.sizes:
            row = measure_size(comm, args, nbytes, runners, mpi, xp)
            if row is not None:
                rows.append(row)
                emit(_table.format_row(row))
        return rows
    finally:
        mpi.Free()


def _cupy():
    import cupy

    return cupy


def _preamble(comm: Any, args: argparse.Namespace, mpi: Any) -> str:
    where = mpi.gather((comm.rank, os.getpid(), socket.gethostname(), comm.device), root=0)
    step = (
        f"{args.stepfactor or 2}(factor)" if args.stepbytes is None else f"{args.stepbytes}(bytes)"
    )
    nodes = getattr(comm, "described", None)  # a hierarchical view: its nodes in words
    how = "" if nodes is None else f", hierarchical over {nodes}"
    lines = [
        f"# collectives benchmark: {args.op}, backend {comm.backend}, {comm.size} ranks{how}",
        f"# minBytes {args.minbytes} maxBytes {args.maxbytes} step: {step} "
        f"warmup iters: {args.warmup_iters} iters: {args.iters} rounds: {args.rounds} "
        f"({args.stat}) validation: {args.check}"
        + (f" baseline: {args.baseline}" if args.baseline else ""),
        "#",
    ]
    for rank, pid, host, device in where or []:
        dev = "cpu" if device is None else f"{device}"
        lines.append(f"#  Rank {rank:2d} Pid {pid:6d} on {host:>10} device {dev}")
    lines.append("#")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark as the command line says; 1 if any result was wrong.

    Example:
        $ mpiexec -n 2 python -m benchmarks.collective --op all_gather -b 1K -e 1M -f 4
    """
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    import collectives as col

    world = col.init(backend=args.backend)
    baseline = None
    comm: Any = world
    try:
        if args.algorithm == "hierarchical":
            comm = col.hierarchical(world)
        xp = np if comm.backend == "mpi" else _cupy()
        if args.baseline == "flat":
            baseline = Ours(world)
            baseline.name = "flat"
        elif args.baseline:
            baseline = make_baseline(args.baseline, comm.mpi_comm, xp)
        lead = comm.rank == 0
        meta = _report.metadata(comm, args, argv)
        rows = run(comm, args, baseline, emit=(lambda s: print(s, flush=True)) if lead else _quiet)
        totals = _table.summary(rows)
        if lead:
            print(_table.footer(totals), flush=True)
            if args.json:
                _report.write_json(args.json, meta, rows, totals)
            if args.plot:
                _report.plot(args.plot, meta, rows)
        return 1 if totals["wrong"] or totals.get("baseline_wrong") else 0
    finally:
        if baseline is not None:
            baseline.close()
        if comm is not world:
            comm.close()
        world.close()


def _quiet(line: str) -> None:
    pass


if __name__ == "__main__":
    sys.exit(main())
