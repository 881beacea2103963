"""The same collectives through the raw libraries, to measure what our layer costs.

Each baseline builds, for a :class:`~benchmarks._case.Case`, the fastest honest raw call on
the very buffers our layer uses, and the result getter that says where that library leaves
the result (MPI's in-place reduce_scatter, for one, leaves it at the start of the buffer).
``build`` returns None where the library has no such form (torch has no out-of-place
all_reduce, MPI no average).

Example:
    >>> base = make_baseline("mpi4py", comm.mpi_comm, np)
    >>> call, result = base.build(case)
"""

from __future__ import annotations

import socket
from typing import Any, Callable

import numpy as np

from collectives import BackendUnavailableError, InvalidArgumentError

from ._case import Case
from ._ours import Built

BASELINES = ("mpi4py", "nccl", "torch", "cupyx")
#: the baselines with a nonblocking form for ``--async`` (flat: ours, not a library): mpi4py's
#: I-verbs, torch's async_op=True, and raw NCCL, whose every call is asynchronous already
ASYNC_BASELINES = ("mpi4py", "nccl", "torch", "flat")
ASYNC_ONLY = (
    "--async compares with --baseline mpi4py (its I-verbs), nccl (every raw call is "
    "asynchronous), torch (async_op=True) or flat only"
)
_REDUCING = ("all_reduce", "reduce", "reduce_scatter")


def _ring(case: Case) -> tuple[int, int]:
    return (case.rank + 1) % case.size, (case.rank - 1) % case.size


class Mpi4pyBaseline:
    """mpi4py's upper-case buffer calls on NumPy arrays (no pickling), on a dup of the world;
    ``async_op``: the nonblocking ones (``Iallreduce``...) and the request's ``Wait``."""

    name = "mpi4py"

    def __init__(self, mpi_comm: Any, async_op: bool = False):
        from mpi4py import MPI

        self.MPI = MPI
        self.comm = mpi_comm.Dup()
        self.async_op = async_op
        self.ops = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}
        self._supported: dict[tuple[str, str | None], bool] = {}

    def _supports(self, dtype: np.dtype, redop: str | None) -> bool:
        """Whether this MPI has ``dtype`` (and ``redop`` on it): float16 is MPI 4.1's
        MPI_SHORT_FLOAT or MPICH's MPIX_C_FLOAT16, and Open MPI 4 has neither. Tried once on
        this rank alone, since every rank runs the same library."""
        key = (dtype.str, redop)
        if key not in self._supported:
            x = np.ones(1, dtype)
            y = np.empty_like(x)
            self_comm = self.MPI.COMM_SELF
            try:
                if redop is None:
                    self_comm.Sendrecv(x, 0, 0, y, 0, 0)
                else:
                    self_comm.Allreduce(x, y, self.ops[redop])
                self._supported[key] = True
            except (self.MPI.Exception, KeyError, ValueError):
                self._supported[key] = False
        return self._supported[key]

    def build(self, case: Case) -> Built | None:
        reducing = case.op in _REDUCING
        if reducing and self.ops.get(case.redop) is None:
            return None  # MPI has no average
        if not self._supports(case.dtype, case.redop if reducing else None):
            return None  # N/A in the table: this MPI has no such datatype or reduction
        return self._build_async(case) if self.async_op else self._build(case)

    def _build(self, case: Case) -> Built | None:
        m, IN_PLACE = self.comm, self.MPI.IN_PLACE
        s, r, b, root = case.send, case.recv, case.buf, case.root
        mpi_op = self.ops.get(case.redop)
        if case.op == "all_reduce":
            f = m.Allreduce
            if case.inplace:
                return (lambda: f(IN_PLACE, b, mpi_op)), lambda: b
            return (lambda: f(s, r, mpi_op)), lambda: r
        if case.op == "reduce":
            f = m.Reduce
            if not case.is_root:
                x = b if case.inplace else s
                return (lambda: f(x, None, mpi_op, root)), lambda: None
            if case.inplace:
                return (lambda: f(IN_PLACE, b, mpi_op, root)), lambda: b
            return (lambda: f(s, r, mpi_op, root)), lambda: r
        if case.op == "broadcast":
            f = m.Bcast
            return ((lambda: f(b, root)), lambda: b) if case.inplace else None
        if case.op == "all_gather":
            f = m.Allgather
            if case.inplace:
                return (lambda: f(IN_PLACE, b)), lambda: b
            return (lambda: f(s, r)), lambda: r
        if case.op == "reduce_scatter":
            f = m.Reduce_scatter_block
            if case.inplace:
                # MPI leaves this rank's block at the start of the buffer, not at [rank]
                return (lambda: f(IN_PLACE, b, mpi_op)), lambda: b[0]
            return (lambda: f(s, r, mpi_op)), lambda: r
        if case.op == "all_to_all":
            f = m.Alltoall
            if case.inplace:
                return (lambda: f(IN_PLACE, b)), lambda: b
            return (lambda: f(s, r)), lambda: r
        if case.op == "gather":
            f = m.Gather
            if not case.is_root:
                x = b if case.inplace else s
                return (lambda: f(x, None, root)), lambda: None
            if case.inplace:
                return (lambda: f(IN_PLACE, b, root)), lambda: b
            return (lambda: f(s, r, root)), lambda: r
        if case.op == "scatter":
            f = m.Scatter
            if case.inplace and case.is_root:
                own = b[case.rank]
                return (lambda: f(b, IN_PLACE, root)), lambda: own
            if case.inplace:
                return (lambda: f(None, b, root)), lambda: b
            return (lambda: f(s, r, root)), lambda: r
        if case.op == "sendrecv":
            if case.inplace:
                return None
            nxt, prv = _ring(case)
            f = m.Sendrecv
            return (lambda: f(s, nxt, 0, r, prv, 0)), lambda: r
        return None

    def _build_async(self, case: Case) -> Built | None:
        """As :meth:`_build`, each call the nonblocking one and its ``Wait`` (in a user's
        loop, ``Iallreduce(...).Wait()``)."""
        m, IN_PLACE = self.comm, self.MPI.IN_PLACE
        s, r, b, root = case.send, case.recv, case.buf, case.root
        mpi_op = self.ops.get(case.redop)
        if case.op == "all_reduce":
            f = m.Iallreduce
            if case.inplace:
                return (lambda: f(IN_PLACE, b, mpi_op).Wait()), lambda: b
            return (lambda: f(s, r, mpi_op).Wait()), lambda: r
        if case.op == "reduce":
            f = m.Ireduce
            if not case.is_root:
                x = b if case.inplace else s
                return (lambda: f(x, None, mpi_op, root).Wait()), lambda: None
            if case.inplace:
                return (lambda: f(IN_PLACE, b, mpi_op, root).Wait()), lambda: b
            return (lambda: f(s, r, mpi_op, root).Wait()), lambda: r
        if case.op == "broadcast":
            f = m.Ibcast
            return ((lambda: f(b, root).Wait()), lambda: b) if case.inplace else None
        if case.op == "all_gather":
            f = m.Iallgather
            if case.inplace:
                return (lambda: f(IN_PLACE, b).Wait()), lambda: b
            return (lambda: f(s, r).Wait()), lambda: r
        if case.op == "reduce_scatter":
            f = m.Ireduce_scatter_block
            if case.inplace:
                return (lambda: f(IN_PLACE, b, mpi_op).Wait()), lambda: b[0]
            return (lambda: f(s, r, mpi_op).Wait()), lambda: r
        if case.op == "all_to_all":
            f = m.Ialltoall
            if case.inplace:
                return (lambda: f(IN_PLACE, b).Wait()), lambda: b
            return (lambda: f(s, r).Wait()), lambda: r
        if case.op == "gather":
            f = m.Igather
            if not case.is_root:
                x = b if case.inplace else s
                return (lambda: f(x, None, root).Wait()), lambda: None
            if case.inplace:
                return (lambda: f(IN_PLACE, b, root).Wait()), lambda: b
            return (lambda: f(s, r, root).Wait()), lambda: r
        if case.op == "scatter":
            f = m.Iscatter
            if case.inplace and case.is_root:
                own = b[case.rank]
                return (lambda: f(b, IN_PLACE, root).Wait()), lambda: own
            if case.inplace:
                return (lambda: f(None, b, root).Wait()), lambda: b
            return (lambda: f(s, r, root).Wait()), lambda: r
        if case.op == "sendrecv":
            if case.inplace:
                return None
            nxt, prv = _ring(case)
            isend, irecv, waitall = m.Isend, m.Irecv, self.MPI.Request.Waitall
            return (lambda: waitall([isend(s, nxt, 0), irecv(r, prv, 0)])), lambda: r
        return None

    def close(self) -> None:
        self.comm.Free()


#: dtype name -> ncclDataType_t; reduce op -> ncclRedOp_t (FACTS.md)
_NCCL_TYPE = {
    "int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
    "float16": 6, "float32": 7, "float64": 8,
}  # fmt: skip
_NCCL_OP = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}


class NcclBaseline:
    """Raw ``cupy.cuda.nccl`` on CuPy arrays, its own communicator, the current stream. Every
    raw call returns once queued on the stream, so ``--async`` times the same calls."""

    name = "nccl"

    def __init__(self, mpi_comm: Any):
        from cupy.cuda import nccl

        self.nccl = nccl
        uid = nccl.get_unique_id() if mpi_comm.rank == 0 else None
        uid = mpi_comm.bcast(uid, root=0)
        self.comm = nccl.NcclCommunicator(mpi_comm.size, uid, mpi_comm.rank)

    def build(self, case: Case) -> Built | None:
        import cupy

        nc, g, c = self.comm, self.nccl, case.count
        # verbs without a reduction name theirs "none", as nccl-tests prints it
        dt, op = _NCCL_TYPE[case.dtype.name], _NCCL_OP.get(case.redop, _NCCL_OP["sum"])
        stream = cupy.cuda.get_current_stream().ptr
        s, r, b, root = case.send, case.recv, case.buf, case.root
        p = {
            name: (a.data.ptr if a is not None else 0) for name, a in (("s", s), ("r", r), ("b", b))
        }
        block = c * case.dtype.itemsize
        own = p["b"] + case.rank * block
        if case.op == "all_reduce":
            src, dst = (p["b"], p["b"]) if case.inplace else (p["s"], p["r"])
            return (
                lambda: nc.allReduce(src, dst, c, dt, op, stream)
            ), lambda: b if case.inplace else r
        if case.op == "reduce":
            src, dst = (p["b"], p["b"]) if case.inplace else (p["s"], p["r"])
            res = (b if case.inplace else r) if case.is_root else None
            return (lambda: nc.reduce(src, dst, c, dt, op, root, stream)), lambda: res
        if case.op == "broadcast":
            if not case.inplace:
                return None
            return (lambda: nc.broadcast(p["b"], p["b"], c, dt, root, stream)), lambda: b
        if case.op == "all_gather":
            src, dst = (own, p["b"]) if case.inplace else (p["s"], p["r"])
            return (lambda: nc.allGather(src, dst, c, dt, stream)), lambda: b if case.inplace else r
        if case.op == "reduce_scatter":
            if case.inplace:
                res = b[case.rank]
                return (lambda: nc.reduceScatter(p["b"], own, c, dt, op, stream)), lambda: res
            return (lambda: nc.reduceScatter(p["s"], p["r"], c, dt, op, stream)), lambda: r
        if case.inplace and case.op in ("all_to_all", "gather", "scatter", "sendrecv"):
            return None  # point-to-point in place would race; nccl-tests does it out of place
        peers = range(case.size)
        if case.op == "all_to_all":

            def all_to_all() -> None:
                g.groupStart()
                for peer in peers:
                    nc.send(p["s"] + peer * block, c, dt, peer, stream)
                    nc.recv(p["r"] + peer * block, c, dt, peer, stream)
                g.groupEnd()

            return all_to_all, lambda: r
        if case.op == "gather":

            def gather() -> None:
                g.groupStart()
                if case.is_root:
                    for peer in peers:
                        nc.recv(p["r"] + peer * block, c, dt, peer, stream)
                nc.send(p["s"], c, dt, root, stream)
                g.groupEnd()

            return gather, lambda: r if case.is_root else None
        if case.op == "scatter":

            def scatter() -> None:
                g.groupStart()
                if case.is_root:
                    for peer in peers:
                        nc.send(p["s"] + peer * block, c, dt, peer, stream)
                nc.recv(p["r"], c, dt, root, stream)
                g.groupEnd()

            return scatter, lambda: r
        if case.op == "sendrecv":
            nxt, prv = _ring(case)

            def sendrecv() -> None:
                g.groupStart()
                nc.send(p["s"], c, dt, nxt, stream)
                nc.recv(p["r"], c, dt, prv, stream)
                g.groupEnd()

            return sendrecv, lambda: r
        return None

    def close(self) -> None:
        self.comm.destroy()


class TorchBaseline:
    """torch.distributed: gloo on NumPy arrays, NCCL on CuPy arrays (shared zero-copy)."""

    name = "torch"

    def __init__(self, mpi_comm: Any, gpu: bool, async_op: bool = False):
        import torch
        import torch.distributed as dist

        self.torch, self.dist = torch, dist
        self.gpu = gpu
        self.async_op = async_op
        if gpu:
            import cupy

            torch.cuda.set_device(cupy.cuda.Device().id)
        one_node = _on_one_node(mpi_comm)
        address = mpi_comm.bcast(_rendezvous(one_node) if mpi_comm.rank == 0 else None, root=0)
        dist.init_process_group(
            "nccl" if gpu else "gloo",
            init_method=f"tcp://{address}",
            rank=mpi_comm.rank,
            world_size=mpi_comm.size,
        )
        self.ops = {
            "sum": dist.ReduceOp.SUM,
            "prod": dist.ReduceOp.PRODUCT,
            "max": dist.ReduceOp.MAX,
            "min": dist.ReduceOp.MIN,
            "avg": dist.ReduceOp.AVG,
        }

    def _tensor(self, a: Any) -> Any:
        if a is None:
            return None
        return self.torch.as_tensor(a, device="cuda") if self.gpu else self.torch.from_numpy(a)

    def _call(self, verb: Any, *args: Any, **kwargs: Any) -> Callable[[], None]:
        """``verb(*args, **kwargs)``; with ``async_op``, ``async_op=True`` and its ``wait()``."""
        if self.async_op:
            return lambda: verb(*args, async_op=True, **kwargs).wait()
        return lambda: verb(*args, **kwargs)

    def build(self, case: Case) -> Built | None:
        d, call = self.dist, self._call
        if not self.gpu and case.redop == "avg" and case.op in _REDUCING:
            return None  # gloo has no ReduceOp.AVG
        if self.gpu and np.dtype(case.dtype).name in _NO_TORCH_NCCL:
            return None  # N/A: torch's NCCL process group has no such dtype
        s, r, b = self._tensor(case.send), self._tensor(case.recv), self._tensor(case.buf)
        op, root = self.ops.get(case.redop), case.root  # None where the op reduces nothing
        if not case.inplace and case.op in ("all_reduce", "reduce", "broadcast"):
            return None  # torch only has these in place
        if case.op == "all_reduce":
            return call(d.all_reduce, b, op), lambda: case.buf
        if case.op == "reduce":
            return call(d.reduce, b, root, op), lambda: case.buf if case.is_root else None
        if case.op == "broadcast":
            return call(d.broadcast, b, root), lambda: case.buf
        # the (size, count) side flat: gloo takes no stacked form (views of the same memory)
        if case.op == "all_gather":
            if case.inplace:
                return call(d.all_gather_into_tensor, b.view(-1), b[case.rank]), lambda: case.buf
            return call(d.all_gather_into_tensor, r.view(-1), s), lambda: case.recv
        if case.op == "reduce_scatter":
            if case.inplace:
                own = b[case.rank]
                flat = b.view(-1)
                return call(d.reduce_scatter_tensor, own, flat, op), lambda: case.buf[case.rank]
            return call(d.reduce_scatter_tensor, r, s.view(-1), op), lambda: case.recv
        if case.inplace:
            return None
        if case.op == "all_to_all":
            return call(d.all_to_all_single, r, s), lambda: case.recv
        if case.op == "gather":
            parts = list(r) if case.is_root else None
            res = case.recv if case.is_root else None
            return call(d.gather, s, parts, dst=root), lambda: res
        if case.op == "scatter":
            parts = list(s) if case.is_root else None
            return call(d.scatter, r, parts, src=root), lambda: case.recv
        # posted and waited for alike, sync or not; gloo has no send to its own rank (1 rank)
        if case.op == "sendrecv" and case.size > 1:
            nxt, prv = _ring(case)

            def sendrecv() -> None:
                ops = [d.P2POp(d.isend, s, nxt), d.P2POp(d.irecv, r, prv)]
                for request in d.batch_isend_irecv(ops):
                    request.wait()

            return sendrecv, lambda: case.recv
        return None

    def close(self) -> None:
        self.dist.destroy_process_group()


class CupyxBaseline:
    """``cupyx.distributed``'s NCCL backend on CuPy arrays (bootstrapped over MPI)."""

    name = "cupyx"

    def __init__(self, mpi_comm: Any):
        import inspect

        from cupyx.distributed import _nccl_comm, init_process_group

        # CuPy 13 takes use_mpi=True; versions with force_store use MPI when it is importable.
        mpi = (
            {"use_mpi": True}
            if "use_mpi" in inspect.signature(init_process_group).parameters
            else {}
        )
        self.comm = init_process_group(mpi_comm.size, mpi_comm.rank, **mpi)
        self.redops = set(getattr(_nccl_comm, "_nccl_ops", ("sum", "prod", "max", "min")))

    def build(self, case: Case) -> Built | None:
        x, s, r, b, root, op = self.comm, case.send, case.recv, case.buf, case.root, case.redop
        if case.inplace and case.op not in ("all_reduce", "broadcast", "reduce"):
            return None
        if case.op in _REDUCING and op not in self.redops:
            return None  # cupyx.distributed has no average
        if case.op == "all_reduce":
            if case.inplace:
                return (lambda: x.all_reduce(b, b, op)), lambda: b
            return (lambda: x.all_reduce(s, r, op)), lambda: r
        if case.op == "reduce":
            src, dst = (b, b) if case.inplace else (s, r)
            return (lambda: x.reduce(src, dst, root, op)), lambda: dst if case.is_root else None
        if case.op == "broadcast":
            return ((lambda: x.broadcast(b, root)), lambda: b) if case.inplace else None
        c = case.count
        if case.op == "all_gather":
            return (lambda: x.all_gather(s, r, c)), lambda: r
        if case.op == "reduce_scatter":
            return (lambda: x.reduce_scatter(s, r, c, op)), lambda: r
        if case.op == "all_to_all":
            return (lambda: x.all_to_all(s, r)), lambda: r
        if case.op == "gather":
            # cupyx checks out_array.shape[0] == size on every rank, root or not
            out = r if case.is_root else case.xp.empty((case.size, 0), case.dtype)
            return (lambda: x.gather(s, out, root)), lambda: r if case.is_root else None
        if case.op == "scatter":
            return (lambda: x.scatter(s, r, root)), lambda: r
        if case.op == "sendrecv":
            nxt, prv = _ring(case)

            return (lambda: _cupyx_ring(x, s, r, nxt, prv)), lambda: r
        return None

    def close(self) -> None:
        getattr(self.comm, "stop", lambda: None)()  # the TCP store, where one was started


def _cupyx_ring(x: Any, s: Any, r: Any, nxt: int, prv: int) -> None:
    from cupy.cuda import nccl

    nccl.groupStart()
    x.send(s, nxt)
    x.recv(r, prv)
    nccl.groupEnd()


#: dtypes torch's NCCL process group refuses (its NCCL type table has no unsigned 32/64-bit)
_NO_TORCH_NCCL = frozenset({"uint32", "uint64"})


def _on_one_node(mpi_comm: Any) -> bool:
    from mpi4py import MPI

    local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return local.Get_size() == mpi_comm.Get_size()
    finally:
        local.Free()


def _rendezvous(one_node: bool) -> str:
    """``host:port`` with a port free right now, for torch's TCP store: on the loopback
    address when every rank is on this host (a host name may resolve to an address the
    store does not listen on, or to none)."""
    host = "127.0.0.1" if one_node else socket.gethostname()
    with socket.socket() as sock:
        sock.bind((host if one_node else "", 0))
        port = sock.getsockname()[1]
    return f"{host}:{port}"


def make_baseline(name: str, mpi_comm: Any, xp: Any, async_op: bool = False) -> Any:
    """The baseline ``name`` over the world of ``mpi_comm``, for arrays of module ``xp``;
    ``async_op``: its nonblocking calls (:data:`ASYNC_BASELINES`)."""
    try:
        return _make_baseline(name, mpi_comm, xp, async_op)
    except ImportError as exc:
        raise BackendUnavailableError(
            f"benchmark: --baseline {name} needs {exc.name or 'a module'}, which is not "
            f"importable here ({exc})"
        ) from exc


def _make_baseline(name: str, mpi_comm: Any, xp: Any, async_op: bool) -> Any:
    gpu = xp is not np
    if async_op and name not in ASYNC_BASELINES:
        raise InvalidArgumentError(f"benchmark: {ASYNC_ONLY}, got --baseline {name}")
    if name == "mpi4py":
        if gpu:
            raise InvalidArgumentError(
                "benchmark: --baseline mpi4py runs on NumPy arrays, expected --backend mpi, "
                "got the NCCL backend (CuPy arrays)"
            )
        return Mpi4pyBaseline(mpi_comm, async_op)
    if name in ("nccl", "cupyx"):
        if not gpu:
            raise InvalidArgumentError(
                f"benchmark: --baseline {name} runs on CuPy arrays, expected --backend nccl, "
                "got the MPI backend (NumPy arrays)"
            )
        return NcclBaseline(mpi_comm) if name == "nccl" else CupyxBaseline(mpi_comm)
    if name == "torch":
        return TorchBaseline(mpi_comm, gpu, async_op)
    raise InvalidArgumentError(
        f"benchmark: --baseline must be one of {', '.join(BASELINES)}, got {name!r}"
    )
