"""``hierarchical(comm)``: all_reduce, reduce_scatter and all_gather in steps inside and
across nodes (Horovod's hierarchical all-reduce), the other verbs passed through.

all_reduce is three steps: a reduce-scatter inside the node (each of the node's L ranks
gets 1/L of the reduction over the node), an all-reduce of that part across the nodes,
among the ranks with the same local rank, and an all-gather inside the node. Only 1/L of
the data crosses between nodes from each rank. reduce_scatter is the first two halves (a
reduce-scatter inside the node, then one across nodes) and all_gather the last two (an
all-gather across nodes, then one inside the node), so that across nodes each rank also
moves only its share.

The node layout is pure (``node_layout``, ``block_order``): tested without a communicator.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Callable

import numpy as np
from mpi4py import MPI

from ._arrays import array_module, as_bfloat16, is_device_array, unwrap
from ._communicator import Communicator
from ._dtypes import FLOATING
from ._errors import invalid, state_error
from ._mpi import divide_in_place
from ._ops import ReduceOp

RANKS_PER_NODE = "COLLECTIVES_RANKS_PER_NODE"
_CALL = "hierarchical"

#: a step of a call: (async_op) -> Work
Step = Callable[[bool], Any]


def node_layout(keys: Sequence[int]) -> list[list[int]]:
    """Ranks grouped by node: ``keys[r]`` names rank r's node; nodes are listed by their
    lowest rank, the ranks of each in rank order.

    Example:
        >>> node_layout([0, 0, 1, 1])          # COLLECTIVES_RANKS_PER_NODE=2, 4 ranks
        [[0, 1], [2, 3]]
        >>> node_layout([5, 9, 5, 9])          # two hosts, ranks placed round-robin
        [[0, 2], [1, 3]]
    """
    nodes: dict[int, list[int]] = {}
    for rank, key in enumerate(keys):
        nodes.setdefault(key, []).append(rank)
    return sorted(nodes.values(), key=lambda ranks: ranks[0])


def emulated_keys(size: int, ranks_per_node: int) -> list[int]:
    """Node keys that make consecutive groups of ``ranks_per_node`` ranks one node each.

    Example: ``emulated_keys(4, 2) == [0, 0, 1, 1]``.
    """
    return [rank // ranks_per_node for rank in range(size)]


def check_even(nodes: list[list[int]], source: str) -> None:
    """Every node must have as many ranks: the steps split data into equal parts per node.

    Example: ``check_even([[0, 1], [2]], "...")`` raises ``InvalidArgumentError``.
    """
    sizes = [len(ranks) for ranks in nodes]
    if len(set(sizes)) > 1:
        total = sum(sizes)
        raise invalid(
            _CALL,
            f"nodes must all have the same number of ranks, got node sizes {sizes} "
            f"({source}, {total} ranks); use the flat communicator, or a number of "
            f"ranks per node that divides {total}",
        )


def block_order(nodes: list[list[int]]) -> list[int]:
    """The ranks in the order the two-step reduce_scatter and all_gather lay out blocks:
    local rank major, node minor (entry ``l * nodes + n`` is local rank l of node n).

    Example: ``block_order([[0, 1], [2, 3]]) == [0, 2, 1, 3]``.
    """
    return [ranks[local] for local in range(len(nodes[0])) for ranks in nodes]


def ranks_per_node_from_env() -> int | None:
    """``COLLECTIVES_RANKS_PER_NODE`` as a positive int, None where unset or empty."""
    text = os.environ.get(RANKS_PER_NODE, "").strip()
    if not text:
        return None
    if not text.isdigit() or int(text) < 1:
        raise invalid(_CALL, f"{RANKS_PER_NODE} must be a positive integer, got {text!r}")
    return int(text)


def hierarchical(
    comm: Communicator, *, ranks_per_node: int | None = None
) -> HierarchicalCommunicator:
    """A view of ``comm`` whose all_reduce, reduce_scatter and all_gather run in steps inside
    and across nodes; every other verb is ``comm``'s own.

    Nodes are the shared-memory split of ``comm``, or consecutive groups of
    ``ranks_per_node`` ranks (default: environment ``COLLECTIVES_RANKS_PER_NODE``), which is
    how the path across nodes runs on one machine. Every node must have the same number of
    ranks: otherwise every rank raises ``InvalidArgumentError`` (with ``ranks_per_node``
    before any communication; with the shared-memory split after it, which every rank
    makes). Collective: every rank of ``comm`` calls it. Close the view (its two
    sub-communicators) before ``comm``.

    Results equal the flat call's exactly for integers and for max and min. For floating
    dtypes sum, avg and prod add (or multiply) in another order, so a result may differ
    from the flat one by the rounding of a reordered sum: at most ``2 * (size - 1) * u *
    sum(|x|)`` per element, over the ranks' values (``u`` the unit roundoff: 2**-24 for
    float32, 2**-53 for float64, 2**-11 for float16, 2**-8 for bfloat16), the same bound in
    relative terms for prod, and for avg two roundings more (floating avg averages in each
    step; integer avg sums and divides once, truncating toward zero as the flat call does).

    Example:
        >>> comm = col.init()                      # COLLECTIVES_RANKS_PER_NODE=2 mpiexec -n 4 ...
        >>> hcomm = col.hierarchical(comm)         # 2 nodes x 2 ranks
        >>> hcomm.all_reduce(grad, op="avg")       # as comm.all_reduce(grad, op="avg")
        >>> ddp = DistributedDataParallel(params, comm=hcomm)
        >>> hcomm.close()
    """
    if not isinstance(comm, Communicator):
        raise invalid(_CALL, f"comm must be a Communicator, got {type(comm).__name__}")
    comm._usable(_CALL)
    if ranks_per_node is None:
        ranks_per_node = ranks_per_node_from_env()
        source = f"{RANKS_PER_NODE}={ranks_per_node}"
    else:
        if type(ranks_per_node) is not int or ranks_per_node < 1:
            raise invalid(_CALL, f"ranks_per_node must be a positive int, got {ranks_per_node!r}")
        source = f"ranks_per_node={ranks_per_node}"
    if ranks_per_node is not None:
        nodes = node_layout(emulated_keys(comm.size, ranks_per_node))
    else:
        nodes = node_layout(_shared_memory_keys(comm.mpi_comm))
        source = "the shared-memory split"
    check_even(nodes, source)
    node = next(n for n, ranks in enumerate(nodes) if comm.rank in ranks)
    local = nodes[node].index(comm.rank)
    intra = comm.split(node, key=comm.rank)
    inter = comm.split(local, key=node)
    assert intra is not None and inter is not None  # every rank passed a color
    return HierarchicalCommunicator(comm, intra, inter, nodes)


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
    """The ``Work`` of a hierarchical call: its steps' Works, the steps still to issue, and
    the copies (or integer avg's division) that follow the last step.

    On NCCL every step is issued at once: the one stream per device runs them in order.
    On MPI a step needs the previous one's result, so only the first is in flight after
    the call and ``wait()`` runs the others: wait for it on every rank, in the same order
    as the calls (as DDP does); ``is_completed()`` stays False until then. Otherwise it
    becomes True once the last step has finished (and runs what follows it, which is local).
    """

    __slots__ = ("_works", "_later", "_after", "_result", "_done")

    def __init__(
        self, works: list[Any], later: list[Step], after: list[Callable[[], None]], result: Any
    ):
        self._works = works  # read by ``completion_event`` (DDP's bucket timings)
        self._later = later
        self._after = after
        self._result = result
        self._done = False

    def wait(self) -> Any:
        """Finish every step (issuing those left, MPI) and order the caller after the result."""
        if not self._done:
            for work in self._works:
                work.wait()
            while self._later:
                self._later.pop(0)(False)
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
    included), ``node`` and ``nodes`` (this rank's node and how many); ``intra`` and
    ``inter``, the communicators of the node and of the ranks sharing this local rank.

    Example:
        >>> hcomm = col.hierarchical(comm)
        >>> hcomm.all_reduce(x)                      # in place, as comm.all_reduce(x)
        >>> work = hcomm.all_gather(y, async_op=True); work.wait()
    """

    def __init__(
        self,
        parent: Communicator,
        intra: Communicator,
        inter: Communicator,
        nodes: list[list[int]],
    ):
        self.parent = parent
        self.intra = intra
        self.inter = inter
        self.rank, self.size = parent.rank, parent.size
        self.backend, self.device, self.stream = parent.backend, parent.device, parent.stream
        self.mpi_comm, self.timeout = parent.mpi_comm, parent.timeout
        self.local_rank, self.local_size = intra.rank, intra.size
        self.node, self.nodes = inter.rank, inter.size
        # A sub-communicator counts only its own ranks on the node; when the parent's ranks
        # outnumber the cores, a waiting rank of either must yield its core early too.
        for sub in (intra, inter):
            sub.yield_after = min(sub.yield_after, parent.yield_after)
        order = block_order(nodes)
        self._order = None if order == list(range(self.size)) else np.array(order)
        self._grouped = False
        self._closed = False

    def __repr__(self) -> str:
        return (
            f"HierarchicalCommunicator({self.nodes} nodes x {self.local_size} ranks, "
            f"rank {self.rank} of {self.size}, over {self.parent!r})"
        )

    # ------------------------------------------------------------ the hierarchical verbs

    def all_reduce(
        self, x: Any, op: ReduceOp | str = "sum", *, out: Any = None, async_op: bool = False
    ) -> Any:
        """As ``Communicator.all_reduce``: reduce-scatter in the node, all-reduce across
        nodes, all-gather in the node. A count that ``local_size`` does not divide is padded.
        """
        call, parent = "all_reduce", self.parent
        x, name = unwrap(x, call)
        op = parent._op(call, op, name)
        out = x if out is None else parent._out(call, out, x, name, x.shape)
        self._check(call, x, out)
        first, second, after = self._ops(op, name, out)
        n, parts = x.size, self.local_size
        chunk = -(-n // parts)
        if chunk * parts == n:
            src = x.reshape(parts, chunk)
            dst = src if out is x else out.reshape(parts, chunk)
        else:  # pad to local_size equal parts; the padding is reduced too, then dropped
            padded = parent._new(x, (parts * chunk,))
            padded[n:] = 0
            padded[:n] = x.reshape(-1)
            src = dst = padded.reshape(parts, chunk)
            after.insert(0, lambda: _copy(out.reshape(-1), padded[:n]))
        mine = dst[self.local_rank]
        w = _wrapper(name)
        return self._start(
            [
                lambda a: self.intra.reduce_scatter(w(src), first, out=w(mine), async_op=a),
                lambda a: self.inter.all_reduce(w(mine), second, async_op=a),
                lambda a: self.intra.all_gather(w(mine), out=w(dst), async_op=a),
            ],
            after,
            out,
            async_op,
        )

    def reduce_scatter(
        self, x: Any, op: ReduceOp | str = "sum", *, out: Any = None, async_op: bool = False
    ) -> Any:
        """As ``Communicator.reduce_scatter``: reduce-scatter in the node (each local rank
        gets the node's sum of the blocks of its peers on every node), then across nodes."""
        call, parent = "reduce_scatter", self.parent
        x, name = unwrap(x, call)
        parent._leading(call, x)
        op = parent._op(call, op, name)
        shape = x.shape[1:]
        if out is None:
            out = parent._new(x, shape)
        else:
            out = parent._slot_out(call, out, x, name, shape, out_is_part=True)
        self._check(call, x, out)
        first, second, after = self._ops(op, name, out)
        block = math.prod(shape)
        blocks = x.reshape(self.size, block)
        if self._order is not None:
            blocks = array_module(x).take(blocks, self._index(x), axis=0)
        ordered = blocks.reshape(self.local_size, self.nodes * block)
        partial = parent._new(x, (self.nodes * block,))
        w = _wrapper(name)
        return self._start(
            [
                lambda a: self.intra.reduce_scatter(w(ordered), first, out=w(partial), async_op=a),
                lambda a: self.inter.reduce_scatter(
                    w(partial.reshape(self.nodes, block)),
                    second,
                    out=w(out.reshape(block)),
                    async_op=a,
                ),
            ],  # fmt: skip
            after,
            out,
            async_op,
        )

    def all_gather(self, x: Any, *, out: Any = None, async_op: bool = False) -> Any:
        """As ``Communicator.all_gather``: all-gather across nodes (the blocks of this local
        rank on every node), then in the node."""
        call, parent = "all_gather", self.parent
        x, name = unwrap(x, call)
        shape = (self.size, *x.shape)
        out = parent._new(x, shape) if out is None else parent._slot_out(call, out, x, name, shape)
        self._check(call, x, out)
        block = x.size
        across = parent._new(x, (self.nodes, block))
        after: list[Callable[[], None]] = []
        if self._order is None:
            gathered = out.reshape(self.local_size, self.nodes * block)
        else:
            gathered = parent._new(x, (self.local_size, self.nodes * block))
            index = self._index(x)

            def place() -> None:
                out.reshape(self.size, block)[index] = gathered.reshape(self.size, block)

            after.append(place)
        w = _wrapper(name)
        return self._start(
            [
                lambda a: self.inter.all_gather(w(x.reshape(block)), out=w(across), async_op=a),
                lambda a: self.intra.all_gather(
                    w(across.reshape(self.nodes * block)), out=w(gathered), async_op=a
                ),
            ],
            after,
            out,
            async_op,
        )

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
            f"all_reduce, reduce_scatter and all_gather in steps over {self.nodes} nodes x "
            f"{self.local_size} ranks; other calls: {self.parent.call_path}"
        )

    def close(self) -> None:
        """Close the two sub-communicators (not the parent). Idempotent."""
        if not self._closed:
            self._closed = True
            self.inter.close()
            self.intra.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> HierarchicalCommunicator:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------ internals

    def _check(self, call: str, x: Any, out: Any) -> None:
        """The checks the flat call makes before communicating, where a step's own would
        name a step's arrays (or come after an earlier step)."""
        if self._closed:
            raise state_error(call, f"the hierarchical view is closed (rank {self.rank})")
        if self._grouped or _nccl_group_open(self.backend):
            raise invalid(
                call,
                "a hierarchical call cannot run inside comm.group(): its steps depend on "
                "each other; call it outside the with-block",
            )
        self.parent._usable(call)
        check_arrays = self.parent._check_arrays
        if check_arrays is not None:
            check_arrays(call, x, out)
        if type(out) is np.ndarray and not out.flags.writeable:
            what = "x" if out is x else "out"
            raise invalid(call, f"{what} is read-only, and {call} writes its result there")

    def _ops(self, op: ReduceOp, name: str, out: Any) -> tuple[ReduceOp, ReduceOp, list]:
        """The op of each step, and what follows the last: integer avg sums and divides once
        (truncating as the flat call does); floating avg averages in each step, which on
        equal nodes is the mean over all ranks and cannot overflow where the sum could."""
        if op is ReduceOp.AVG and name not in FLOATING:
            size = self.size
            return ReduceOp.SUM, ReduceOp.SUM, [lambda: divide_in_place(out, size)]
        return op, op, []

    def _index(self, like: Any) -> Any:
        """The block order as an index array of ``like``'s module (on its device)."""
        xp = array_module(like)
        if xp is np:
            return self._order
        with like.device:
            return xp.asarray(self._order)

    def _start(self, steps: list[Step], after: list, result: Any, async_op: bool) -> Any:
        if self.backend == "nccl":  # one stream per device orders the steps: issue all now
            works, later = [step(True) for step in steps], []
        else:  # a step reads the previous one's result: only the first can be in flight
            works, later = [steps[0](True)], steps[1:]
        work = HierarchicalWork(works, later, after, result)
        return work if async_op else work.wait()


def _wrapper(name: str) -> Callable[[Any], Any]:
    """How a step passes an array: storage arrays of bfloat16 travel as bfloat16."""
    return as_bfloat16 if name == "bfloat16" else _same


def _same(a: Any) -> Any:
    return a


def _copy(out: Any, values: Any) -> None:
    out[...] = values


def _nccl_group_open(backend: str) -> bool:
    """Whether this thread is inside a ``group()`` of any NCCL communicator (NCCL's group is
    per thread: a step issued there would be held until the group's end)."""
    if backend != "nccl":
        return False
    from ._nccl_group import current

    return current().open
