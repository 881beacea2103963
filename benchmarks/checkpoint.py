"""mpiexec -n 2 python -m benchmarks.checkpoint --size 1G --dir /tmp/ckpt-bench

Throughput of ``ddp.checkpoint`` against plain NumPy files of the same bytes.

Every rank holds ``size / ranks`` bytes of float32 state, as a block of one global tensor
per 64 MiB (``--tensor``). Rounds alternate the order of the timed operations, each
starting after a barrier and timed to the last rank's end; the median over ``--rounds``:

- ``save``: ``checkpoint.save`` (safetensors files, CRC-32 while writing, fsync, index,
  rename), each rank writing its own blocks in parallel (older checkpoints are removed
  between timings, untimed);
- ``tofile+fsync``: each rank ``ndarray.tofile`` of the same bytes into the same directory,
  then ``os.fsync`` (the same durability as ``save``), and ``tofile`` alone (no fsync:
  the data may still be in the page cache when the time is taken);
- ``load`` (checksums checked: every file read twice) and ``load, no verify``, against
  ``numpy.fromfile`` of the baseline files (reads hit the page cache after the writes);
- ``async blocked``: how long ``save(..., async_op=True)`` blocks the caller (the host
  copy) before ``handle.wait()``, against the whole synchronous ``save``.

Throughputs are total bytes over the time; ratios are ours over the baseline (above 1 is
faster). Options: --size 1G --tensor 64M --rounds 3 --dir DIR (default: a temporary one).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

import collectives as col
from ddp import checkpoint

from ._sizes import parse_size


def timed(comm: Any, fn: Callable[[], Any]) -> float:
    comm.barrier()
    start = time.perf_counter()
    fn()
    comm.barrier()
    return time.perf_counter() - start


def state_of(comm: Any, total: int, tensor: int) -> dict[str, Any]:
    """``total`` bytes over the ranks as blocks of float32 tensors of ``tensor`` bytes each."""
    per_rank = total // comm.size // 4
    per_tensor = max(1, min(per_rank, tensor // comm.size // 4))
    state: dict[str, Any] = {}
    for i, start in enumerate(range(0, per_rank, per_tensor)):
        n = min(per_tensor, per_rank - start)
        local = np.random.default_rng([comm.rank, i]).random(n, dtype=np.float32)
        state[f"t{i:04d}"] = checkpoint.Shard(local, (n * comm.size,), (n * comm.rank,))
    return state


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="1G")
    parser.add_argument("--tensor", default="64M")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None)
    args = parser.parse_args(argv)
    total, tensor = parse_size(args.size), parse_size(args.tensor, "tensor")
    with col.init() as comm:
        made = tempfile.mkdtemp(prefix="ckpt-bench-") if comm.rank == 0 and not args.dir else None
        base = Path(comm.mpi_comm.bcast(args.dir or made))
        state = state_of(comm, total, tensor)
        arrays = [s.local for s in state.values()]
        nbytes = comm.mpi_comm.allreduce(sum(a.nbytes for a in arrays))
        raw = base / f"baseline-rank{comm.rank:05d}.bin"
        targets = {n: checkpoint.Shard(np.empty_like(s.local), s.global_shape, s.offsets)
                   for n, s in state.items()}  # fmt: skip
        times: dict[str, list[float]] = {}

        def tofile(sync: bool) -> None:
            with open(raw, "wb") as f:
                for a in arrays:
                    a.tofile(f)
                if sync:
                    f.flush()
                    os.fsync(f.fileno())

        def fromfile() -> None:
            with open(raw, "rb") as f:
                for a in arrays:
                    np.fromfile(f, dtype=a.dtype, count=a.size)

        step = [0]

        def save() -> None:
            step[0] += 1
            checkpoint.save(base / "ours", state, comm, step=step[0])

        def drop_old() -> None:  # untimed: a save with keep=1 would time the deletion too
            if comm.rank == 0:
                for old in sorted((base / "ours").glob("step-*"))[:-1]:
                    shutil.rmtree(old)
            comm.barrier()

        blocked = [0.0]

        def save_async() -> None:
            step[0] += 1
            comm.barrier()
            start = time.perf_counter()
            handle = checkpoint.save(
                base / "ours", state, comm, step=step[0], keep=1, async_op=True
            )
            blocked[0] = comm.mpi_comm.allreduce(time.perf_counter() - start, op=max_op())
            handle.wait()

        ops: list[tuple[str, Callable[[], Any]]] = [
            ("save", save),
            ("tofile+fsync", lambda: tofile(True)),
            ("tofile", lambda: tofile(False)),
            ("load", lambda: checkpoint.load(base / "ours", targets, comm)),
            (
                "load, no verify",
                lambda: checkpoint.load(base / "ours", targets, comm, verify=False),
            ),
            ("fromfile", fromfile),
        ]
        for r in range(args.rounds):
            order = ops if r % 2 == 0 else ops[:3][::-1] + ops[3:][::-1]
            for name, fn in order:
                times.setdefault(name, []).append(timed(comm, fn))
                drop_old()
            timed(comm, save_async)
            drop_old()
            times.setdefault("async blocked", []).append(blocked[0])
        for name, s in targets.items():  # the last load read back what was saved
            assert np.array_equal(s.local, state[name].local), name
        if comm.rank == 0:
            median = {k: statistics.median(v) for k, v in times.items()}
            gib = nbytes / 2**30
            print(f"# {comm.size} ranks, {gib:.2f} GiB of float32 in {len(state)} tensors, "
                  f"{args.rounds} rounds (median), directory {base}")  # fmt: skip
            print(f"# {'operation':<16} {'seconds':>8} {'GiB/s':>7}  ratio")
            pairs = {"save": "tofile+fsync", "load": "fromfile", "load, no verify": "fromfile",
                     "async blocked": "save"}  # fmt: skip
            for name, t in median.items():
                ratio = f"{median[pairs[name]] / t:.2f}x {pairs[name]}" if name in pairs else ""
                if name == "save":
                    ratio += f", {median['tofile'] / t:.2f}x tofile"
                print(f"  {name:<16} {t:8.3f} {gib / t:7.2f}  {ratio}")
        comm.barrier()
        if args.dir is None and comm.rank == 0:
            shutil.rmtree(base, ignore_errors=True)
        elif comm.rank == 0:
            shutil.rmtree(base / "ours", ignore_errors=True)
        raw.unlink(missing_ok=True)


def max_op() -> Any:
    from mpi4py import MPI

    return MPI.MAX


if __name__ == "__main__":
    main()
