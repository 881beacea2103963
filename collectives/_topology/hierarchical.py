"""``hierarchical(comm)``: all_reduce, reduce_scatter and all_gather in steps inside and
across nodes (Horovod's hierarchical all-reduce), the other verbs passed through.

all_reduce is three steps: a reduce-scatter inside the node (each of the node's L ranks
gets 1/L of the reduction over the node), an all-reduce of that part across the nodes,
among the ranks with the same local rank, and an all-gather inside the node. Only 1/L of
the data crosses between nodes from each rank. reduce_scatter is the first two halves (a
reduce-scatter inside the node, then one across nodes) and all_gather the last two (an
all-gather across nodes, then one inside the node), so that across nodes each rank also
moves only its share. Where nodes differ in size, the ranks of a smaller node carry the
parts of the missing local ranks too (``_nodes``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from .._arrays import array_module, as_bfloat16, is_device_array, unwrap
from .._core.args import check_leading, checked_op, checked_out, checked_slot_out, new_like
from .._core.communicator import Communicator
from .._dtypes import FLOATING
from .._errors import CommunicatorStateError, InvalidArgumentError
from .._nccl.device import ordering_stream
from .._numerics import bfloat16_to_float32, divide_in_place, float32_copies, float32_to_bfloat16
from .._ops import ReduceOp
from .nodes import NodeLayout, emulated_keys, node_layout, ranks_per_node_from_env

_CALL = "hierarchical"

#: a step of a call: (async_op) -> Work
Step = Callable[[bool], Any]


def hierarchical(
    comm: Communicator, *, ranks_per_node: int | None = None
) -> HierarchicalCommunicator:
    """A view of ``comm`` whose all_reduce, reduce_scatter and all_gather run in steps inside
    and across nodes; every other verb is ``comm``'s own.

    Nodes are the shared-memory split of ``comm``, or consecutive groups of
    ``ranks_per_node`` ranks (default: environment ``COLLECTIVES_RANKS_PER_NODE``), which is
    how the path across nodes runs on one machine. Nodes may differ in size (a last node
    with fewer ranks): a rank of a smaller node then carries the parts of the missing local
    ranks across nodes too. Collective: every rank of ``comm`` calls it. Close the view
    (its sub-communicators) before ``comm``.

    Results equal the flat call's exactly for integers and for max and min. For floating
    dtypes sum, avg and prod add (or multiply) in another order, so a result may differ
    from the flat one by the rounding of a reordered sum: at most ``2 * (size - 1) * u *
    sum(|x|)`` per element, over the ranks' values (``u`` the unit roundoff: 2**-24 for
    float32, 2**-53 for float64, 2**-11 for float16, 2**-8 for bfloat16), the same bound in
    relative terms for prod, and for avg two roundings more. Floating avg averages in each
    step on equal nodes (the mean of the node means); integer avg, and any avg on unequal
    nodes, sums and divides once by ``size`` (integers truncating toward zero as the flat
    call does).

    Example:
        >>> from ddp import DistributedDataParallel
        >>> comm = col.init()                      # COLLECTIVES_RANKS_PER_NODE=2 mpiexec -n 4 ...
        >>> hcomm = col.hierarchical(comm)         # 2 nodes of 2 ranks
        >>> hcomm.all_reduce(grad, op="avg")       # as comm.all_reduce(grad, op="avg")
        array([1., 1., 1., 1.], dtype=float32)
        >>> ddp = DistributedDataParallel(params, comm=hcomm)
        >>> hcomm.close(); comm.close()
    """
    if not isinstance(comm, Communicator):
        raise InvalidArgumentError(
            f"{_CALL}: comm must be a Communicator, got {type(comm).__name__}"
        )
    comm.ensure_usable(_CALL)
    if ranks_per_node is None:
        ranks_per_node = ranks_per_node_from_env()
    elif type(ranks_per_node) is not int or ranks_per_node < 1:
        raise InvalidArgumentError(
            f"{_CALL}: ranks_per_node must be a positive int, got {ranks_per_node!r}"
        )
    comm.arrive(_CALL)  # the node split below blocks: first check that every rank came
    if ranks_per_node is not None:
        nodes = node_layout(emulated_keys(comm.size, ranks_per_node))
    else:
        nodes = node_layout(_shared_memory_keys(comm.mpi_comm))
    node = next(n for n, ranks in enumerate(nodes) if comm.rank in ranks)
    layout = NodeLayout(nodes, node, nodes[node].index(comm.rank))
    intra = comm.split(node, key=comm.rank)
    carriers: dict[int, Any] = {}  # slot -> the communicator of its carriers
    if layout.even:  # each rank carries the slot of its local rank: one split
        carriers[layout.local] = comm.split(layout.local, key=node)
    else:  # one split per slot, of its carriers on every node (ranks in order of node)
        served = set(layout.served)
        for slot in range(layout.widest):
            sub = comm.split(0 if slot in served else None, key=node)
            if slot in served:
                carriers[slot] = sub
    assert intra is not None and all(c is not None for c in carriers.values())
    return HierarchicalCommunicator(comm, intra, [carriers[s] for s in layout.served], layout)


def _shared_memory_keys(mpi_comm: MPI.Comm) -> list[int]:
    """Each rank's node, named by the lowest rank of its shared-memory split (metadata only:
    the pickling calls of mpi4py are fine here)."""
    local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        lowest = min(local.allgather(mpi_comm.Get_rank()))
    finally:
        local.Free()
    return mpi_comm.allgather(lowest)


class HierarchicalWork:
    """The ``Work`` of a hierarchical call: its steps' Works, the phases of steps still to
    issue, and the copies (or avg's division) that follow the last step.

    A phase is the steps that can run together (one per communicator: the all-reduces of
    the slots a rank carries across nodes, say); each phase reads the previous one's result.
    On NCCL every step is issued at once, ordered on a stream of the view's. On
    MPI only the first phase is in flight after the call and ``wait()`` issues the others:
    wait for it on every rank, in the same order as the calls (as DDP does);
    ``is_completed()`` stays False until then. Otherwise it becomes True once the last step
    has finished (and runs what follows it, which is local).
    """

    __slots__ = ("_works", "_later", "_after", "_result", "_done", "_one_step_each")

    def __init__(
        self,
        works: list[Any],
        later: list[list[Step]],
        after: list[Callable[[], None]],
        result: Any,
        one_step_each: bool = True,
    ):
        self._works = works
        self._later = later
        self._after = after
        self._result = result
        self._done = False
        # Whether every rank has one step in each phase (equal nodes). Only then may a phase
        # run as a blocking call: MPI never matches a blocking collective with a non-blocking
        # one, and on unequal nodes the rank alone on a small node issues two steps at once.
        self._one_step_each = one_step_each

    def wait(self) -> Any:
        """Finish every step (issuing those left, MPI) and order the caller after the result."""
        if not self._done:
            for work in self._works:
                work.wait()
            while self._later:
                phase = self._later.pop(0)
                if len(phase) == 1 and self._one_step_each:  # blocking where it applies
                    phase[0](False)
                else:
                    for work in [step(True) for step in phase]:
                        work.wait()
            self._finish()
        return self._result

    def is_completed(self) -> bool:
        """True once the result is in place; never issues communication."""
        if not self._done and not self._later and all(w.is_completed() for w in self._works):
            self._finish()
        return self._done

    def synchronize(self) -> Any:
        """Block the host until the result is in place (the timeout applies to each step)."""
        result = self.wait()
        if is_device_array(result):  # the copies after the last step ran on this stream
            array_module(result).cuda.get_current_stream().synchronize()
        return result

    @property
    def event(self) -> Any:
        """The CUDA event the last step completes with (NCCL, where every step is issued at
        once; DDP times its buckets by it), else None. The local copies after it are not
        covered."""
        if self._later or not self._works:
            return None
        return self._works[-1].event  # a Work (each step is one call, async_op=True)

    @property
    def result(self) -> Any:
        """The output array (valid once waited)."""
        return self._result

    def _finish(self) -> None:
        for then in self._after:
            then()
        self._after = []
        self._done = True


class HierarchicalCommunicator:
    """A communicator view: all_reduce, reduce_scatter and all_gather in steps inside and
    across nodes, the other verbs those of ``parent``. Made by :func:`hierarchical`.

    Attributes: ``rank``, ``size``, ``backend``, ``device``, ``stream``, ``mpi_comm`` as
    the parent's; ``local_rank`` and ``local_size`` within the node (emulated ones
    included), ``node`` and ``nodes`` (this rank's node and how many); ``intra``, the
    communicator of the node, and ``inter``, that of the ranks that carry this rank's local
    rank's part on every node (on equal nodes: the ranks of this local rank).

    Example:
        >>> hcomm = col.hierarchical(comm)
        >>> hcomm.nodes, hcomm.node, hcomm.local_rank, hcomm.local_size
        (1, 0, 0, 1)
        >>> hcomm.all_reduce(x)                      # in place, as comm.all_reduce(x)
        array([0., 1., 2., 3.], dtype=float32)
        >>> work = hcomm.all_gather(x, async_op=True)
        >>> work.wait()                              # one row per rank
        array([[0., 1., 2., 3.]], dtype=float32)
        >>> hcomm.close()
    """

    def __init__(
        self,
        parent: Communicator,
        intra: Communicator,
        carriers: list[Communicator],
        layout: NodeLayout,
    ):
        self.parent = parent
        self.intra = intra
        self.inter = carriers[0]
        self.rank, self.size = parent.rank, parent.size
        self.backend, self.device, self.stream = parent.backend, parent.device, parent.stream
        self.mpi_comm, self.timeout = parent.mpi_comm, parent.timeout
        self.local_rank, self.local_size = intra.rank, intra.size
        self.node, self.nodes = layout.node, len(layout.nodes)
        self.layout = layout
        self._carriers = carriers  # row j: the communicator of slot local_rank + j * local_size
        # Index arrays of the arrangements (None where no reordering is needed).
        slots = layout.slot_rows()
        self._slot_rows = None if slots == list(range(layout.widest)) else np.array(slots)
        self._slot_positions = np.array(layout.slot_positions())
        blocks = layout.block_rows()
        self._block_rows = None if blocks == list(range(self.size)) else np.array(blocks)
        # The rows that hold a rank's block, and whose block (where some rows are unused).
        used = [i for i, rank in enumerate(blocks) if rank < self.size]
        self._used_rows = np.array(used)
        self._unused_rows = len(used) < len(blocks)
        self._used_ranks = np.array([blocks[i] for i in used])
        self._arrangements = {
            "_slot_rows": self._slot_rows,
            "_slot_positions": self._slot_positions,
            "_block_rows": self._block_rows,
            "_used_rows": self._used_rows,
            "_used_ranks": self._used_ranks,
        }
        self._indexes: dict[Any, dict[str, Any]] = {}
        self._grouped = False
        self._closed = False

    @property
    def xp(self) -> Any:
        """The array module of the backend (the parent's ``xp``)."""
        return self.parent.xp

    @property
    def described(self) -> str:
        """The nodes in words: ``"2 nodes of 2 ranks"``, ``"2 nodes of 2 or 1 ranks"``."""
        sizes = sorted({len(ranks) for ranks in self.layout.nodes}, reverse=True)
        return f"{self.nodes} nodes of {' or '.join(map(str, sizes))} ranks"

    # ------------------------------------------------------------ the hierarchical verbs

    def all_reduce(
        self, x: Any, op: ReduceOp | str = "sum", *, out: Any = None, async_op: bool = False
    ) -> Any:
        """As ``Communicator.all_reduce``: reduce-scatter in the node, all-reduce across
        nodes, all-gather in the node. A count that the largest node's size does not divide
        is padded."""
        call = "all_reduce"
        x, name = unwrap(x, call)
        op = checked_op(call, op, name)
        out = x if out is None else checked_out(call, out, x, name, x.shape)
        self._check(call, x, out)
        result, x, out, name, narrow = self._widened(op, name, x, out)
        first, second, after = self._ops(op, name, out, narrow)
        n, slots, rows = x.size, self.layout.widest, self.layout.slots_per_rank
        chunk = -(-n // slots)
        if self._slot_rows is None and chunk * slots == n:  # the slots are x's parts, in order
            src = x.reshape(self.local_size, rows * chunk)
            dst = src if out is x else out.reshape(self.local_size, rows * chunk)
        else:  # padded to equal slots, plus a zero row for the unused rows of a smaller node
            padded = new_like(x, (slots + 1, chunk))
            flat = padded.reshape(-1)
            flat[n:] = 0
            flat[:n] = x.reshape(-1)
            if self._slot_rows is None:
                arranged = padded[:slots]
            else:  # a smaller node: the slots of each of its ranks side by side
                arranged = self._take(padded, "_slot_rows")
            src = dst = arranged.reshape(self.local_size, rows * chunk)

            def copy_back() -> None:
                by_slot = arranged if self._slot_rows is None else self._take(
                    arranged, "_slot_positions")  # fmt: skip
                out.reshape(-1)[...] = by_slot.reshape(-1)[:n]

            after.insert(0, copy_back)
        mine = dst[self.local_rank].reshape(rows, chunk)
        w = _wrapper(name)

        def inside(a: bool) -> Any:
            return self.intra.reduce_scatter(w(src), first, out=w(mine.reshape(-1)), async_op=a)

        def across(j: int, carriers: Communicator, a: bool) -> Any:
            return carriers.all_reduce(w(mine[j]), second, async_op=a)

        def back(a: bool) -> Any:
            return self.intra.all_gather(w(mine.reshape(-1)), out=w(dst), async_op=a)

        return self._start([[inside], self._each_carrier(across), [back]], after, result, async_op)

    def reduce_scatter(
        self, x: Any, op: ReduceOp | str = "sum", *, out: Any = None, async_op: bool = False
    ) -> Any:
        """As ``Communicator.reduce_scatter``: reduce-scatter in the node (each local rank
        gets the node's sum of the blocks of the ranks whose slot it carries, on every node),
        then across nodes."""
        call = "reduce_scatter"
        x, name = unwrap(x, call)
        check_leading(call, x, self.size)
        op = checked_op(call, op, name)
        shape = x.shape[1:]
        if out is None:
            out = new_like(x, shape)
        else:
            out = checked_slot_out(call, out, x, name, shape, self.rank, out_is_part=True)
        self._check(call, x, out)
        result, x, out, name, narrow = self._widened(op, name, x, out)
        first, second, after = self._ops(op, name, out, narrow)
        block, rows, nodes = math.prod(shape), self.layout.slots_per_rank, self.nodes
        blocks = x.reshape(self.size, block)
        if self._block_rows is not None:
            if self._unused_rows:  # which read a zero block
                spare = new_like(x, (self.size + 1, block))
                spare[: self.size] = blocks
                spare[self.size] = 0
                blocks = spare
            blocks = self._take(blocks, "_block_rows")
        arranged = blocks.reshape(self.local_size, rows * nodes * block)
        partial = new_like(x, (rows, nodes, block))
        # row 0 is this rank's own slot, whose block is the result; other rows' are not
        unused = new_like(x, (block,)) if len(self._carriers) > 1 else None
        w = _wrapper(name)

        def inside(a: bool) -> Any:
            return self.intra.reduce_scatter(
                w(arranged), first, out=w(partial.reshape(-1)), async_op=a
            )

        def across(j: int, carriers: Communicator, a: bool) -> Any:
            mine = out.reshape(block) if j == 0 else unused
            return carriers.reduce_scatter(w(partial[j]), second, out=w(mine), async_op=a)

        return self._start([[inside], self._each_carrier(across)], after, result, async_op)

    def all_gather(self, x: Any, *, out: Any = None, async_op: bool = False) -> Any:
        """As ``Communicator.all_gather``: all-gather across nodes (the blocks of the ranks
        whose slot this rank carries, on every node), then in the node."""
        call = "all_gather"
        x, name = unwrap(x, call)
        shape = (self.size, *x.shape)
        out = (
            new_like(x, shape)
            if out is None
            else checked_slot_out(call, out, x, name, shape, self.rank)
        )
        self._check(call, x, out)
        block, rows, nodes = x.size, self.layout.slots_per_rank, self.nodes
        gathered_across = new_like(x, (rows, nodes, block))
        nothing = None  # what this rank sends for the slots it carries for missing ranks
        if len(self._carriers) > 1:
            nothing = new_like(x, (block,))
            nothing[...] = 0
        after: list[Callable[[], None]] = []
        if self._block_rows is None:
            gathered = out.reshape(self.local_size, rows * nodes * block)
        else:
            gathered = new_like(x, (self.local_size, rows * nodes * block))

            def place() -> None:
                by_row = gathered.reshape(-1, block)
                if self._unused_rows:
                    by_row = self._take(by_row, "_used_rows")
                    into = self._index(x, "_used_ranks")
                else:
                    into = self._index(x, "_block_rows")
                out.reshape(self.size, block)[into] = by_row

            after.append(place)
        w = _wrapper(name)

        def across(j: int, carriers: Communicator, a: bool) -> Any:
            mine = x.reshape(block) if j == 0 else nothing
            return carriers.all_gather(w(mine), out=w(gathered_across[j]), async_op=a)

        def inside(a: bool) -> Any:
            return self.intra.all_gather(
                w(gathered_across.reshape(-1)), out=w(gathered), async_op=a
            )

        return self._start([self._each_carrier(across), [inside]], after, out, async_op)

    # ------------------------------------------------------------ passed through

    def reduce(self, x: Any, root: int = 0, op: ReduceOp | str = "sum", *, out: Any = None,
               async_op: bool = False) -> Any:  # fmt: skip
        return self.parent.reduce(x, root, op, out=out, async_op=async_op)

    def broadcast(self, x: Any, root: int = 0, *, async_op: bool = False) -> Any:
        return self.parent.broadcast(x, root, async_op=async_op)

    def all_to_all(self, x: Any, *, out: Any = None, async_op: bool = False) -> Any:
        return self.parent.all_to_all(x, out=out, async_op=async_op)

    def gather(self, x: Any, root: int = 0, *, out: Any = None, async_op: bool = False) -> Any:
        return self.parent.gather(x, root, out=out, async_op=async_op)

    def scatter(
        self, x: Any = None, root: int = 0, *, out: Any = None, async_op: bool = False
    ) -> Any:
        return self.parent.scatter(x, root, out=out, async_op=async_op)

    def send(self, x: Any, peer: int, *, async_op: bool = False) -> Any:
        return self.parent.send(x, peer, async_op=async_op)

    def recv(self, x: Any, peer: int, *, async_op: bool = False) -> Any:
        return self.parent.recv(x, peer, async_op=async_op)

    def sendrecv(
        self,
        x: Any,
        peer: int,
        *,
        out: Any = None,
        source: int | None = None,
        async_op: bool = False,
    ) -> Any:
        return self.parent.sendrecv(x, peer, out=out, source=source, async_op=async_op)

    def barrier(self, *, async_op: bool = False) -> Any:
        return self.parent.barrier(async_op=async_op)

    def split(self, color: int | None, key: int | None = None) -> Communicator | None:
        return self.parent.split(color, key)

    @contextmanager
    def group(self) -> Iterator[HierarchicalCommunicator]:
        """The parent's group. The hierarchical verbs refuse to run inside it: their steps
        depend on each other, and a group completes its calls together at its end."""
        with self.parent.group():
            previous, self._grouped = self._grouped, True
            try:
                yield self
            finally:
                self._grouped = previous

    @property
    def call_path(self) -> str:
        return (
            f"all_reduce, reduce_scatter and all_gather in steps over {self.described}; "
            f"other calls: {self.parent.call_path}"
        )

    def close(self) -> None:
        """Close the sub-communicators (not the parent). Idempotent."""
        if not self._closed:
            self._closed = True
            for sub in (*self._carriers, self.intra):
                sub.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        where = f"rank {self.rank} of {self.size}, over {self.parent!r}"
        return f"HierarchicalCommunicator({self.described}, {where})"

    def __enter__(self) -> HierarchicalCommunicator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------ internals

    def _check(self, call: str, x: Any, out: Any) -> None:
        """The checks the flat call makes before communicating, where a step's own would
        name a step's arrays (or come after an earlier step)."""
        if self._closed:
            raise CommunicatorStateError(
                f"{call}: the hierarchical view is closed (rank {self.rank})"
            )
        if self._grouped or _nccl_group_open(self.backend):
            raise InvalidArgumentError(
                f"{call}: a hierarchical call cannot run inside comm.group(): its steps depend on "
                "each other; call it outside the with-block"
            )
        self.parent.ensure_usable(call)
        self.parent.check_arrays(call, x, out)

    def _ops(self, op: ReduceOp, name: str, out: Any, end: list) -> tuple[ReduceOp, ReduceOp, list]:
        """The op of each step, and what follows the last (``end`` last). Floating avg on equal
        nodes averages in each step: the mean of the node means, which cannot overflow where the
        sum could. Integer avg, and any avg on unequal nodes, sums and divides once (integers
        truncating as the flat call does; float16 in float32 copies, lest its sum overflow)."""
        if op is not ReduceOp.AVG or (name in FLOATING and self.layout.even):
            return op, op, end
        size = self.size
        return ReduceOp.SUM, ReduceOp.SUM, [lambda: _divide(out, name, size), *end]

    def _widened(self, op: ReduceOp, name: str, x: Any, out: Any) -> tuple:
        """``out``, then the arrays, dtype and last step of the float32 copies that _ops names."""
        if op is not ReduceOp.AVG or name != "float16" or self.layout.even:
            return out, x, out, name, []
        wide_x, wide_out, narrow = float32_copies(x, out)
        return out, wide_x, wide_out, "float32", [narrow]

    def _index(self, like: Any, which: str) -> Any:
        """The index array ``which`` in ``like``'s module (made once per device)."""
        xp = array_module(like)
        if xp is np:
            return self._arrangements[which]
        cached = self._indexes.setdefault(like.device.id, {})
        if which not in cached:
            with like.device:
                cached[which] = xp.asarray(self._arrangements[which])
        return cached[which]

    def _take(self, a: Any, which: str) -> Any:
        """The rows of ``a`` that the index array ``which`` lists, as a new array."""
        return array_module(a).take(a, self._index(a, which), axis=0)

    def _issue_in_order(self, phases: list[list[Step]]) -> list[Any]:
        """NCCL: issue every step at once, each phase ordered after the previous one on a
        stream of this thread's (each communicator runs on a stream of its own, so nothing
        else orders them), itself ordered after the caller's stream; the caller's stream is
        left free, as an ``async_op=True`` call leaves it."""
        import cupy

        assert self.device is not None
        caller = cupy.cuda.get_current_stream(self.device)
        lane = ordering_stream(self.device)
        works: list[Any] = []
        with cupy.cuda.Device(self.device):
            lane.wait_event(caller.record(cupy.cuda.Event(disable_timing=True)))
            with lane:
                for phase in phases:
                    issued = [step(True) for step in phase]
                    for work in issued:
                        work.wait()  # the lane (current in here) waits for this phase
                    works.extend(issued)
        return works

    def _each_carrier(self, step: Callable[[int, Communicator, bool], Any]) -> list[Step]:
        """``step`` once per slot this rank carries, in slot order (the same on every rank)."""
        return [functools.partial(step, j, c) for j, c in enumerate(self._carriers)]

    def _start(self, phases: list[list[Step]], after: list, result: Any, async_op: bool) -> Any:
        """Issue the phases of a call (see :class:`HierarchicalWork`). Every communicator
        has its step of a call in the same phase on each of its ranks, so its calls are
        issued in the same order everywhere."""
        if self.backend == "nccl":  # every step issued now, ordered on a stream of the view's
            works, later = self._issue_in_order(phases), []
        elif async_op:  # a phase reads the previous one's result: only the first can be in flight
            works, later = [step(True) for step in phases[0]], phases[1:]
        else:
            works, later = [], phases
        work = HierarchicalWork(works, later, after, result, self.layout.even)
        return work if async_op else work.wait()


def _wrapper(name: str) -> Callable[[Any], Any]:
    """How a step passes an array: storage arrays of bfloat16 travel as bfloat16."""
    return as_bfloat16 if name == "bfloat16" else _same


def _same(a: Any) -> Any:
    return a


def _divide(out: Any, name: str, size: int) -> None:
    """avg's one division, of bfloat16 bits too."""
    if name == "bfloat16":
        values = bfloat16_to_float32(out)
        values /= size
        float32_to_bfloat16(values, out)
    else:
        divide_in_place(out, size)


def _nccl_group_open(backend: str) -> bool:
    """Whether this thread is inside a ``group()`` of any NCCL communicator (NCCL's group is
    per thread: a step issued there would be held until the group's end)."""
    if backend != "nccl":
        return False
    from .._nccl.groups import current

    return current().open
