"""nccl-tests for the collectives layer: time and check one collective over a size sweep.

Run it (the table goes to rank 0's stdout)::

    mpiexec -n 4 python -m benchmarks.collective --op all_reduce -b 8 -e 128M -f 2
    mpiexec -n 2 python -m benchmarks.collective -b 8 -e 16M -f 4 --baseline mpi4py \\
        --json out.json --plot out.png

nccl-tests' programs (``python -m benchmarks.all_reduce_perf`` and the others) are this
``main`` with the collective fixed and nccl-tests' defaults; both parse ``_cli``'s command
line. Each (type, reduce op, root) and size: every form of the call (out of place, in place)
is run ``-c`` times on fresh data and its result compared element by element with a NumPy
reference (``#wrong``); then, after ``-w`` warm-up calls, ``-n`` times ``-m`` calls are
timed between a barrier and a synchronisation of the device, and the per-call time is
combined over ranks as ``-a`` says (the mean by default). With ``--baseline``, the raw library
runs on the same buffers in the same process, its timed blocks interleaved with ours
(``--rounds``, alternating which goes first), and each time reported is the median (or,
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

from . import _cli, _data, _report, _table
from ._baselines import make_baseline
from ._busbw import HYPERCUBE, REDUCING, ROOTED, bandwidths, counts, row_bytes
from ._case import Case
from ._ours import Ours


def parser() -> argparse.ArgumentParser:
    """The command line: nccl-tests' flags, with ``--op`` naming the collective."""
    return _cli.parser(None)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parsed flags, with the sweep resolved into ``args.sizes``; bad values exit 2."""
    return _cli.parse_args(argv, None)


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
    """One row of the table (None when ``nbytes`` holds no element per rank); ``args``
    holds one type, reduce op and root."""
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
        # the baselines take no bfloat16 (its data are uint16 bits) and have no hypercube:
        # N/A in their columns
        if (k == 0 or not (_data.is_bfloat16(dtype) or op == HYPERCUBE))
        and (b := runner.build(cases[p])) is not None
    }
    wrong = _check_and_warm_up(built, cases, args, sync)
    seconds = _over_ranks(mpi.allgather(_time_rounds(built, args, sync, mpi.Barrier)), args)
    wrong = np.sum(mpi.allgather(wrong), axis=0)
    pick = statistics.median if args.stat == "median" else min
    cells = {
        key: _cell(op, c.count, dtype, n, pick(seconds[:, j].tolist()),
                   int(wrong[j]) if args.check else None)
        for j, key in enumerate(built)
    }  # fmt: skip
    row: dict[str, Any] = {
        "size": row_bytes(c, dtype.itemsize),
        "count": c.count,
        "type": _data.type_name(dtype),
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


def _over_ranks(per_rank: list[np.ndarray], args: argparse.Namespace) -> np.ndarray:
    """Each rank's seconds made one, as nccl-tests' ``-a``: rank 0's, the mean, min or max."""
    stacked = np.stack(per_rank)
    return [stacked[0], stacked.mean(0), stacked.min(0), stacked.max(0)][args.average]


def _check_and_warm_up(built: dict, cases: dict, args: argparse.Namespace, sync) -> np.ndarray:
    """Run each form ``-c`` times (once with ``-c 0``) on fresh data and count wrong
    elements; then the warm-up calls."""
    wrong = np.zeros(len(built), np.int64)
    for j, ((_, p), (call, result)) in enumerate(built.items()):
        for _ in range(max(1, args.check)):
            cases[p].reset()
            sync()
            call()
            sync()
            if args.check:
                wrong[j] += _data.count_wrong(result(), cases[p].expected())
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
                call = _blocking(built[keys[j]][0], args.blocking, sync, barrier)
                seconds[r, j] = _time_block(call, args.iters * args.agg_iters, sync, barrier)
    return seconds


def _blocking(call: Callable[[], Any], mode: int, sync, barrier) -> Callable[[], Any]:
    """nccl-tests' ``-z``: wait for the device after each call, and (1, 3) barrier too."""
    if mode == 0:
        return call
    if mode == 2:
        return lambda: (call(), sync())

    return lambda: (call(), sync(), barrier())


def run(
    comm: Any,
    args: argparse.Namespace,
    baseline: Any = None,
    emit: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """The whole sweep, ``-N`` times: every size for each (type, reduce op, root), in one
    table; ``emit`` gets it line by line (pass a no-op off rank 0)."""
    check_roots(args, comm.size)
    xp = np if comm.backend == "mpi" else _cupy()
    runners = [Ours(comm)] + ([baseline] if baseline is not None else [])
    mpi = comm.mpi_comm.Dup()  # our own barrier and reductions, apart from what is timed
    try:
        where = mpi.gather(_where(comm), root=0) or []
        emit(_table.preamble(args, comm.backend, where, getattr(comm, "described", None)))
        name = baseline.name if baseline is not None else None
        emit(_table.header(name, bool(args.report_cputime), bool(args.report_timestamps)))
        rows: list[dict[str, Any]] = []
        if args.op == HYPERCUBE and comm.size & (comm.size - 1):
            emit(f"nRanks {comm.size} is not a power of 2, skipping")  # as nccl-tests
            return rows
        for _ in range(args.run_cycles):
            for dtype, redop, root in _cli.combinations(args, comm.size):
                one = argparse.Namespace(**{**vars(args), "dtype": dtype, "redop": redop,
                                            "root": max(root, 0)})  # fmt: skip
                for nbytes in args.sizes:
                    row = measure_size(comm, one, nbytes, runners, mpi, xp)
                    if row is not None:
                        rows.append(row)
                        stamp = time.strftime(_table.TIMESTAMP) if args.report_timestamps else None
                        emit(_table.format_row(row, stamp))
        return rows
    finally:
        mpi.Free()


def check_roots(args: argparse.Namespace, size: int) -> None:
    """Every root (-r) of a rooted collective must be a rank of this world (the others
    ignore it, as in nccl-tests)."""
    for root in args.roots if args.op in ROOTED and args.roots else []:
        if root >= size:
            raise InvalidArgumentError(f"benchmark: root (-r) must be in [0, {size}), got {root}")


def _cupy():
    import cupy

    return cupy


def _where(comm: Any) -> tuple[int, int, str, int, str, str]:
    """This rank's line of ``# Using devices``: rank, pid, host, device, PCI id, its name."""
    host = socket.gethostname()
    if comm.device is None:
        return comm.rank, os.getpid(), host, -1, "0000:00:00", "CPU"
    cupy = _cupy()
    device = cupy.cuda.Device(comm.device)
    name = cupy.cuda.runtime.getDeviceProperties(comm.device)["name"]
    bus = device.pci_bus_id.lower().rsplit(".", 1)[0]  # 0000:3b:00.0 -> 0000:3b:00
    return comm.rank, os.getpid(), host, comm.device, bus, name.decode(errors="replace")


def main(argv: list[str] | None = None, collective: str | None = None) -> int:
    """Run the benchmark as the command line says; 1 if any result was wrong, 2 if the
    command line is bad. ``collective``: the ``*_perf`` program's (None: ``--op``).

    Example:
        $ mpiexec -n 2 python -m benchmarks.collective --op all_gather -b 1K -e 1M -f 4
    """
    argv = sys.argv[1:] if argv is None else argv
    args = _cli.parse_args(argv, collective)
    import collectives as col

    world = col.init(backend=args.backend, **({"timeout": args.timeout} if args.timeout else {}))
    baseline = None
    comm: Any = world
    try:
        try:
            check_roots(args, world.size)  # every rank fails alike: nobody waits on another
        except InvalidArgumentError as exc:
            _cli.usage_error(collective, str(exc).removeprefix("benchmark: "))
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
            print(_table.footer(totals, _cli.PROGRAMS[args.op]), flush=True)
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
