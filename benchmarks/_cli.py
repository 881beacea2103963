"""The command line both fronts share: nccl-tests' flags, names and defaults, plus ours.

``python -m benchmarks.all_reduce_perf`` (and the other ``*_perf`` programs) take nccl-tests'
command line as it is; ``python -m benchmarks.collective`` takes the same flags and names the
collective with ``--op`` (so that nccl-tests' ``-o/--op``, the reduce op, is ``-o/--op-reduce``
there). Flags that cannot change anything here are accepted at the value that means "off"
and refused otherwise with a one-line reason. A bad command line prints one usage line and
the error on rank 0 only and exits with status 2, before any rank communicates.

Example:
    >>> args = parse_args(["-b", "8", "-e", "64", "-f", "2", "-d", "all"], "all_reduce")
    >>> args.sizes, [type_name(t) for t in args.types][:3]
    ([8, 16, 32, 64], ['int8', 'uint8', 'int32'])
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

import numpy as np

from collectives import InvalidArgumentError

from ._baselines import ASYNC_BASELINES, ASYNC_ONLY, BASELINES
from ._busbw import OPS, REDUCING, ROOTED
from ._data import NCCL_TYPES, REDOPS, storage_dtype, type_name
from ._sizes import DEFAULT_STEP, c_integer, parse_size, size_sweep

#: nccl-tests' program for each collective
PROGRAMS = {
    "all_reduce": "all_reduce_perf",
    "reduce": "reduce_perf",
    "broadcast": "broadcast_perf",
    "all_gather": "all_gather_perf",
    "reduce_scatter": "reduce_scatter_perf",
    "all_to_all": "alltoall_perf",
    "gather": "gather_perf",
    "scatter": "scatter_perf",
    "sendrecv": "sendrecv_perf",
    "hypercube": "hypercube_perf",
}
#: -d aliases: NumPy's names for nccl-tests' half, float and double
_ALIASES = {"float16": "half", "float32": "float", "float64": "double"}
_WHY_NOT = {
    "mulsum": "the collectives API has no mulsum (nccl-tests' premultiplied sum)",
    "f8e4m3": "the collectives API has no 8-bit float types",
    "f8e5m2": "the collectives API has no 8-bit float types",
}

# (flag, dest, the values accepted, why no other): nccl-tests flags with nothing to change here
_NEUTRAL = (
    ("-t", "nthreads", {1}, "one thread per process: each rank is its own MPI process"),
    ("-g", "ngpus", {1}, "one GPU per rank: start one rank per GPU"),
    ("-G", "cudagraph", {0}, "the collectives API does not capture CUDA graphs"),
    ("-y", "stream_null", {0}, "the collectives API runs on its communicator's stream"),
    (
        "-R",
        "local_register",
        {0},
        "the collectives API does not register user buffers (timed rounds are --rounds)",
    ),
    ("-D", "device_implementation", {0}, "the collectives API has no device-side API"),
    ("-M", "memory", {0}, "buffers are allocated by the array library (NumPy or CuPy)"),
    ("-u", "unalign", {0}, "buffers are the array library's, aligned as it allocates them"),
    ("-I", "per_iter_timing", {0}, "calls are timed in blocks, not one by one"),
    ("-p", "parallel_init", {0, 1}, "one thread per process: nothing to start in parallel"),
)


class _Parser(argparse.ArgumentParser):
    """argparse whose errors are one usage line and the message, on rank 0 only, status 2."""

    def error(self, message: str) -> NoReturn:
        if launcher_rank() == 0:
            sys.stderr.write(f"{self.format_usage()}{self.prog}: error: {message}\n")
            sys.stderr.flush()
        # Every rank parses the same arguments and leaves here, before any communicator is
        # made: not collectives' sys.exit of one rank, which aborts the job (and may take rank
        # 0's usage line with it).
        raise SystemExit(2)


def launcher_rank() -> int:
    """This process's rank as the MPI launcher set it in the environment (0 without one)."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "MPI_LOCALRANKID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def _size_arg(text: str) -> int:
    try:
        return parse_size(text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _int_arg(text: str) -> int:
    """An integer flag's value as nccl-tests reads it (``strtol(..., 0)``: ``0x4`` is 4)."""
    try:
        return c_integer(text)
    except InvalidArgumentError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("c_integer: ")) from None


def parser(collective: str | None = None) -> argparse.ArgumentParser:
    """nccl-tests' command line for ``collective``'s program, or, with None, the
    ``benchmarks.collective`` one (``--op`` picks the collective; its own defaults)."""
    perf = collective is not None
    prog = f"python -m benchmarks.{PROGRAMS[collective] if perf else 'collective'}"
    p = _Parser(prog=prog, usage="%(prog)s [-h] [options]",
                description="Time and check a collective over a sweep of sizes, as nccl-tests "
                "does (flags, defaults and output are nccl-tests').")  # fmt: skip
    if not perf:
        p.add_argument("--op", default="all_reduce", choices=OPS, help="collective (all_reduce)")
    a = p.add_argument
    for flag, dest, allowed, _ in _NEUTRAL:  # the flags that change nothing here
        only = "/".join(str(v) for v in sorted(allowed))
        a(flag, f"--{dest}", type=_int_arg, default=min(allowed), help=f"{only} only")
    a("-b", "--minbytes", type=_size_arg, default=32 << 20 if perf else 8, help="min size")
    a("-e", "--maxbytes", type=_size_arg, default=32 << 20, help="max size (32M)")
    a("-i", "--stepbytes", type=_size_arg, default=None, help="size increment (1M)")
    a("-f", "--stepfactor", type=_int_arg, default=1 if perf else None,
      help="size multiplication factor; above 1 it wins over -i" + ("" if perf else " (2)"))  # fmt: skip
    a("-n", "--iters", type=_int_arg, default=20, help="timed calls per block (20)")
    a("-m", "--agg_iters", type=_int_arg, default=1, help="calls per timed iteration (1)")
    a("-w", "--warmup_iters", type=_int_arg, default=1 if perf else 5, help="warm-up calls")
    a("-N", "--run_cycles", type=_int_arg, default=1, help="sweeps of each type, op and root (1)")
    a("-c", "--check", type=_int_arg, default=1,
      help="checked calls per size and form (1; 0: none)")  # fmt: skip
    a("-o", "--op" if perf else "--op-reduce", dest="redop", default="sum",
      help="reduce op: sum, prod, max, min, avg or all (sum)")  # fmt: skip
    a("-d", "--datatype", dest="dtype", default="float" if perf else "float32",
      help=f"type: {', '.join(NCCL_TYPES)} or all (float)")  # fmt: skip
    a("-r", "--root", default="0",
      help="root of rooted collectives; -1 or every: each rank in turn (0)")  # fmt: skip
    a("-z", "--blocking", type=_int_arg, default=0, help="wait (and barrier) after each call: 0-3")
    a("-T", "--timeout", type=float, default=0, help="seconds before a call is declared hung")
    a("-C", "--report_cputime", type=_int_arg, default=0,
      help="1: time until the calls returned (cputime)")  # fmt: skip
    a("-S", "--report_timestamps", type=_int_arg, default=0, help="1: a timestamp column")
    a("-J", "--output_file", default=None, metavar="PATH",
      help="nccl-tests' JSON, if PATH ends in .json (never overwritten: PATH.0, PATH.1...)")  # fmt: skip
    a("--json", default=None, metavar="PATH",
      help="rows, baselines and run metadata as JSON, this project's layout (overwritten)")  # fmt: skip
    a("-a", "--average", type=_int_arg, default=1,
      help="over ranks: 0 rank 0, 1 mean, 2 min, 3 max")  # fmt: skip
    a("-x", "--cta_policy", default=None, help="not settable")
    a("-V", "--device_cta_count", type=_int_arg, default=16, help="no effect without -D")
    a("-K", "--per_iter_skip", type=_int_arg, default=0, help="no effect without -I")
    a("--backend", default="auto", choices=("auto", "mpi", "nccl"))
    a("--algorithm", default="flat", choices=("flat", "hierarchical"),
      help="hierarchical: all_reduce, reduce_scatter, all_gather through col.hierarchical "
      "(nodes: the shared-memory split, or COLLECTIVES_RANKS_PER_NODE)")  # fmt: skip
    a("--baseline", default=None, choices=(*BASELINES, "flat"),
      help="raw library to compare with (flat: this library's flat calls, for --algorithm)")  # fmt: skip
    a("--rounds", type=_int_arg, default=None,
      help="timed blocks per size and form (1; 5 with --baseline)")  # fmt: skip
    a("--stat", default="median", choices=("median", "min"), help="over rounds")
    a("--plot", default=None, metavar="PATH", help="draw busbw vs size (PNG)")
    if perf:
        p.set_defaults(op=collective, async_op=False)
    else:
        a("--async", dest="async_op", action="store_true",
          help="each call with async_op=True and wait() (mpi4py: its I-verbs and Wait; torch: "
          "async_op=True and wait(); raw NCCL: its calls, asynchronous already)")  # fmt: skip
    return p


def parse_args(argv: list[str] | None = None, collective: str | None = None) -> argparse.Namespace:
    """Parsed flags with ``sizes``, ``types``, ``redops`` and ``roots`` resolved (``roots``
    None: every rank). Bad values exit 2 with one usage line on rank 0."""
    p = parser(collective)
    args = p.parse_args(argv)
    args.prog = p.prog
    try:
        _resolve(args)
    except InvalidArgumentError as exc:
        p.error(str(exc).removeprefix("benchmark: "))
    return args


def usage_error(collective: str | None, message: str) -> NoReturn:
    """Exit 2 with the usage line and ``message`` (rank 0 only), as a bad flag does."""
    parser(collective).error(message)


def _resolve(args: argparse.Namespace) -> None:
    args.sizes = size_sweep(args.minbytes, args.maxbytes, args.stepfactor, args.stepbytes)
    factor = args.stepfactor
    if factor is None:
        factor = 1 if args.stepbytes is not None else 2
    # the header's "step:" as nccl-tests prints it
    args.step = f"{factor}(factor)" if factor > 1 else f"{args.stepbytes or DEFAULT_STEP}(bytes)"
    args.factor = factor
    if args.rounds is None:
        args.rounds = 5 if args.baseline else 1
    for flag, value, least in (("-n", args.iters, 1), ("-w", args.warmup_iters, 0),
                               ("--rounds", args.rounds, 1), ("-m", args.agg_iters, 1),
                               ("-c", args.check, 0), ("-T", args.timeout, 0)):  # fmt: skip
        if value < least:
            raise InvalidArgumentError(f"{flag} must be >= {least}, got {value}")
    if args.run_cycles < 1:
        raise InvalidArgumentError(f"-N must be >= 1 (0 runs forever), got {args.run_cycles}")
    for flag, dest, allowed, why in _NEUTRAL:
        if getattr(args, dest) not in allowed:
            got = getattr(args, dest)
            raise InvalidArgumentError(f"{flag} {got} is not supported here: {why}")
    if args.cta_policy is not None:
        raise InvalidArgumentError("-x is not supported here: NCCL picks its CTA policy")
    for flag, value, top in (("-z", args.blocking, 3), ("-a", args.average, 3),
                             ("-C", args.report_cputime, 1),
                             ("-S", args.report_timestamps, 1)):  # fmt: skip
        if not 0 <= value <= top:
            raise InvalidArgumentError(f"{flag} must be in 0..{top}, got {value}")
    if args.async_op and args.baseline not in (None, *ASYNC_BASELINES):
        raise InvalidArgumentError(f"{ASYNC_ONLY}, got --baseline {args.baseline}")
    if args.async_op and args.op == "hypercube":
        raise InvalidArgumentError(
            "--async does not apply to hypercube: its steps are groups, which complete at their end"
        )
    args.types = _types(args.dtype)
    redops = _redops(args.redop)  # read (and warned about) whatever the collective
    args.redops = redops if args.op is None or args.op in RUN_PER_REDOP else ["sum"]
    args.roots = _roots(args.root)


#: the collectives whose sweep runs once per reduce op (-o): the reductions and, as in
#: nccl-tests, sendrecv (which only prints the op)
RUN_PER_REDOP = REDUCING | {"sendrecv"}


def _fallback(what: str, name: str, default: str) -> None:
    """nccl-tests' answer to an unknown -d or -o: a warning on stdout, then its default."""
    if launcher_rank() == 0:
        print(f"invalid {what} {name}, defaulting to {default} .. ", flush=True)


def _types(name: str) -> list[np.dtype]:
    if name == "all":
        return [storage_dtype(t) for t in NCCL_TYPES]
    if name in _WHY_NOT:
        raise InvalidArgumentError(f"-d {name} is not supported here: {_WHY_NOT[name]}")
    name = _ALIASES.get(name, name)
    if name not in NCCL_TYPES:
        _fallback("type", name, "float")
        name = "float"
    return [storage_dtype(name)]


def _redops(name: str) -> list[str]:
    if name == "all":
        return list(REDOPS)
    if name in _WHY_NOT:
        raise InvalidArgumentError(f"-o {name} is not supported here: {_WHY_NOT[name]}")
    if name not in REDOPS:
        _fallback("op", name, "sum")
        name = "sum"
    return [name]


def _roots(text: str) -> list[int] | None:
    """``-r``: a rank; ``-1`` (nccl-tests) or ``every``: each rank in turn; ``all`` is
    root 0, as nccl-tests' ``strtol`` reads it."""
    if text.strip() in ("every", "-1"):
        return None
    if text.strip() == "all":
        return [0]
    try:
        root = c_integer(text)
    except InvalidArgumentError:
        root = -2
    if root < 0:
        raise InvalidArgumentError(f"root (-r) must be a rank, -1 or every, got {text!r}")
    return [root]


def combinations(args: argparse.Namespace, size: int) -> list[tuple[np.dtype, str, int]]:
    """(type, reduce op, root) in nccl-tests' order: types, then ops, then roots; a
    collective without a reduce op or root runs once per type (sendrecv once per op)."""
    op = args.op
    redops = args.redops if op in RUN_PER_REDOP else ["none"]
    roots = (args.roots or list(range(size))) if op in ROOTED else [-1]
    return [(t, o, r) for t in args.types for o in redops for r in roots]


__all__ = ["PROGRAMS", "combinations", "launcher_rank", "parse_args", "parser", "type_name"]
