"""nccl-tests for the collectives layer: time and check one collective over a size sweep.

Run it (the table goes to rank 0's stdout)::

    mpiexec -n 4 python -m benchmarks.collective --op all_reduce -b 8 -e 128M -f 2
    mpiexec -n 2 python -m benchmarks.collective -b 8 -e 16M -f 4 --baseline mpi4py \\
        --json out.json --plot out.png
    mpiexec -n 2 python -m benchmarks.collective -b 8 -e 1K -f 2 --baseline mpi4py --async

nccl-tests' programs (``python -m benchmarks.all_reduce_perf`` and the others) are this
``main`` with the collective fixed and nccl-tests' defaults; both parse ``_cli``'s command
line. Each (type, reduce op, root) and size: every form of the call (out of place, in place)
is run ``-c`` times on fresh data and its result compared element by element with a NumPy
reference (``#wrong``); then, after ``-w`` warm-up calls, ``-n`` times ``-m`` calls are
timed between a barrier and a synchronisation of the device, and the per-call time is
combined over ranks as ``-a`` says (the mean by default). With ``--baseline``, the raw library
runs on the same buffers in the same process, its timed blocks interleaved with ours
(``--rounds``, alternating which goes first), and each time reported is the median (or,
with ``--stat min``, the best) of the rounds. With ``--async`` every call is made with
``async_op=True`` and waited on at once (the mpi4py baseline: its I-verb and ``Wait``).
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

from . import _cli, _data, _nccl_json, _report, _table
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


def _time_block(
    call: Callable[[], Any], iters: int, sync: Callable[[], None], barrier
) -> tuple[float, float]:
    """Seconds per call over ``iters`` back-to-back calls, started together on all ranks, as
    nccl-tests times them: the host clock from a barrier to the device synchronisation after
    the last call; and, for ``-C``, the host time until the last call returned."""
    sync()
    barrier()
    start = time.perf_counter()
    for _ in range(iters):
        call()
    issued = time.perf_counter()
    sync()
    return (time.perf_counter() - start) / iters, (issued - start) / iters


def _cell(op: str, count: int, dtype: np.dtype, size: int, seconds: float, wrong: int | None,
          ranks_wrong: int = 0) -> dict[str, Any]:  # fmt: skip
    algbw, busbw = bandwidths(op, count, dtype.itemsize, size, seconds)
    cell = {"time_us": seconds * 1e6, "algbw": algbw, "busbw": busbw, "wrong": wrong}
    # nccl-tests' "Out of bounds values" adds, per rank, the results it found wrong
    cell["ranks_wrong"] = ranks_wrong
    return cell


def measure_size(
    comm: Any, args: argparse.Namespace, nbytes: int, runners: list[Any], mpi: Any, xp: Any
) -> dict[str, Any]:
    """One row of the table (a size that holds no element per rank is a row of count 0,
    as in nccl-tests); ``args`` holds one type, reduce op and root."""
    op, dtype, n = args.op, np.dtype(args.dtype), comm.size
    c = counts(op, nbytes, dtype.itemsize, n)
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
    timed = _time_rounds(built, args, sync, mpi.Barrier)[int(bool(args.report_cputime))]
    seconds = _over_ranks(mpi.allgather(timed), args)
    per_rank = np.stack(mpi.allgather(wrong))  # (ranks, forms, checks)
    pick = statistics.median if args.stat == "median" else min
    cells = {}
    for j, key in enumerate(built):
        # sendrecv in place is timed, never checked, as nccl-tests ("#wrong" N/A)
        checked = args.check and not (op == "sendrecv" and key[1] == "in_place")
        found, ranks = _first_wrong_check(per_rank[:, j, :])
        cells[key] = _cell(op, c.count, dtype, n, pick(seconds[:, j].tolist()),
                           found if checked else None, ranks if checked else 0)  # fmt: skip
    row: dict[str, Any] = {
        "size": row_bytes(c, dtype.itemsize),
        "count": c.count,
        "type": _data.type_name(dtype),
        "redop": _redop_column(op, args.redop),
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


def _redop_column(op: str, redop: str) -> str:
    """nccl-tests' redop column: the op for the reductions and sendrecv (which runs once per
    ``-o`` op), blank for hypercube, ``none`` for the others."""
    if op in REDUCING or op == "sendrecv":
        return redop
    return "" if op == HYPERCUBE else "none"


def _first_wrong_check(wrong: np.ndarray) -> tuple[int, int]:
    """(wrong elements, ranks with any) of the first check that went wrong anywhere, or of
    the last one, from ``wrong`` (ranks, checks): nccl-tests stops checking at the first
    wrong result and reports that check."""
    totals = wrong.sum(axis=0)
    bad = np.flatnonzero(totals)
    c = int(bad[0]) if bad.size else wrong.shape[1] - 1
    return int(totals[c]), int(np.count_nonzero(wrong[:, c]))


def _over_ranks(per_rank: list[np.ndarray], args: argparse.Namespace) -> np.ndarray:
    """Each rank's seconds made one, as nccl-tests' ``-a``: rank 0's, the mean, min or max."""
    stacked = np.stack(per_rank)
    return [stacked[0], stacked.mean(0), stacked.min(0), stacked.max(0)][args.average]


def _check_and_warm_up(built: dict, cases: dict, args: argparse.Namespace, sync) -> np.ndarray:
    """Run each form ``-c`` times (once with ``-c 0``) on fresh data and count wrong
    elements, (forms, checks); then the warm-up calls."""
    wrong = np.zeros((len(built), max(1, args.check)), np.int64)
    for j, ((_, p), (call, result)) in enumerate(built.items()):
        for k in range(max(1, args.check)):
            cases[p].reset()
            sync()
            call()
            sync()
            if args.check:
                wrong[j, k] = _data.count_wrong(result(), cases[p].expected())
        for _ in range(args.warmup_iters):
            call()
        sync()
    return wrong


def _time_rounds(built: dict, args: argparse.Namespace, sync, barrier) -> np.ndarray:
    """Seconds per call, (2, rounds, forms): to the synchronisation, and to the last call's
    return (``-C``); ours and the baseline alternate, block by block."""
    keys = list(built)
    seconds = np.zeros((2, args.rounds, len(keys)))
    for r in range(args.rounds):
        for p in _table.PLACEMENTS:
            js = [j for j, key in enumerate(keys) if key[1] == p]
            # odd rounds run the baseline first, so that neither side always follows the other
            for j in js if r % 2 == 0 else reversed(js):
                call = _blocking(built[keys[j]][0], args.blocking, sync, barrier)
                seconds[:, r, j] = _time_block(call, args.iters * args.agg_iters, sync, barrier)
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
    on_row: Callable[[list[dict[str, Any]]], None] | None = None,
    on_devices: Callable[[list[tuple]], None] | None = None,
    nccl: tuple[int, int] = (0, 0),
) -> list[dict[str, Any]]:
    """Each (type, reduce op, root) in turn, its size sweep ``-N`` times, in one table, as
    nccl-tests; ``emit`` gets it line by line (pass a no-op off rank 0), ``on_row`` the rows
    so far after each row (to save them as they come), ``on_devices`` the device lines."""
    check_roots(args, comm.size)
    xp = np if comm.backend == "mpi" else _cupy()
    runners = [Ours(comm, args.async_op)] + ([baseline] if baseline is not None else [])
    mpi = comm.mpi_comm.Dup()  # our own barrier and reductions, apart from what is timed
    try:
        where = mpi.gather(_where(comm), root=0) or []
        if on_devices is not None:
            on_devices(where)
        nodes = getattr(comm, "described", None)
        emit(_table.preamble(args, comm.backend, where, nodes, nccl))
        name = baseline.name if baseline is not None else None
        emit(_table.header(name, bool(args.report_cputime), bool(args.report_timestamps)))
        rows: list[dict[str, Any]] = []
        if args.op == HYPERCUBE and comm.size & (comm.size - 1):
            # nccl-tests prints this with printf, not its rank-0 PRINT: once per rank
            say(f"nRanks {comm.size} is not a power of 2, skipping")
            return rows
        for dtype, redop, root in _cli.combinations(args, comm.size):
            one = argparse.Namespace(**{**vars(args), "dtype": dtype, "redop": redop,
                                        "root": max(root, 0)})  # fmt: skip
            for _ in range(args.run_cycles):
                for nbytes in args.sizes:
                    row = measure_size(comm, one, nbytes, runners, mpi, xp)
                    rows.append(row)
                    stamp = time.strftime(_table.TIMESTAMP) if args.report_timestamps else None
                    emit(_table.format_row(row, stamp))
                    if on_row is not None:
                        on_row(rows)
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
            baseline = Ours(world, args.async_op)
            baseline.name = "flat"
        elif args.baseline:
            baseline = make_baseline(args.baseline, comm.mpi_comm, xp, args.async_op)
        lead = comm.rank == 0
        meta = _report.metadata(comm, args, argv)
        nccl = _nccl_versions(comm.backend)
        upstream = _upstream_json(args, argv, nccl[1]) if lead else None
        emit = say if lead else _quiet
        rows = run(
            comm, args, baseline, emit=emit,
            on_row=_saver(args, meta, upstream) if lead else None,
            on_devices=(lambda where: upstream.config(args, where)) if upstream else None,
            nccl=nccl,
        )  # fmt: skip
        totals = _table.summary(rows)
        min_bw = _min_bw()
        if lead:
            say(_table.footer(totals, _cli.PROGRAMS[args.op], min_bw))
            if upstream is not None:
                upstream.finish(totals, min_bw)
            if args.json:
                _report.write_json(args.json, meta, rows, totals)
            if args.plot:
                _report.plot(args.plot, meta, rows)
        low = min_bw is not None and totals["avg_busbw"] < min_bw * 0.9
        return 1 if totals["wrong"] or totals.get("baseline_wrong") or low else 0
    finally:
        if baseline is not None:
            baseline.close()
        if comm is not world:
            comm.close()
        world.close()


def _quiet(line: str) -> None:
    pass


def say(text: str) -> None:
    """``text`` and a newline to stdout in one write, at once: under mpiexec, where every
    rank's output is merged, a line written in two pieces can be split by another rank's."""
    sys.stdout.flush()
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError):  # a stdout with no file (captured): no other rank
        sys.stdout.write(text + "\n")
        sys.stdout.flush()
        return
    data = (text + "\n").encode()
    while data:
        data = data[os.write(fd, data) :]


def _nccl_versions(backend: str) -> tuple[int, int]:
    """(NCCL built against, NCCL loaded) as nccl-tests' version line gives them; 0 without
    NCCL (the MPI backend)."""
    if backend != "nccl":
        return 0, 0
    try:
        from cupy.cuda import nccl

        return int(nccl.get_build_version()), int(nccl.get_version())
    except Exception:  # an odd CuPy build must not stop the benchmark over a header line
        return 0, 0


def _upstream_json(args: argparse.Namespace, argv: list[str], nccl_version: int):
    """``-J``: nccl-tests' JSON file, claimed (never overwriting) and announced as nccl-tests
    does, before its version line; None without ``-J`` or where nothing can be written."""
    if not args.output_file:
        return None
    path, line = _nccl_json.claim(args.output_file)
    say(line)
    return _nccl_json.NcclTestsJson(path, [args.prog, *argv], nccl_version) if path else None


def _saver(args: argparse.Namespace, meta: dict[str, Any], upstream: Any):
    """Saves each row as it is measured: to ``-J``'s file and to ``--json``'s."""

    def save(rows: list[dict[str, Any]]) -> None:
        if upstream is not None:
            upstream.add(rows[-1], args)
        if args.json:
            _report.write_json(args.json, meta, rows, _table.summary(rows), complete=False)

    return save


def _min_bw() -> float | None:
    """nccl-tests' ``NCCL_TESTS_MIN_BW``: the least average busbw (GB/s) that passes."""
    text = os.environ.get("NCCL_TESTS_MIN_BW")
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        return 0.0  # nccl-tests' atof


if __name__ == "__main__":
    sys.exit(main())
