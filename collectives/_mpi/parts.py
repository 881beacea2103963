"""The MPI backend's verbs on more than ``limit`` elements per rank (``_mpi.MAX_COUNT``).

Where counts are C ints (Open MPI 5 has no large-count calls), one MPI call cannot take them.
Each verb is remade from calls on contiguous runs of at most ``limit`` elements of one basic
type, so that no derived datatype is needed (a reduction over one is not portable):
all_gather as one broadcast from each rank, reduce_scatter as one reduce to each rank, and
gather, scatter, all_to_all and send/recv as point-to-point messages, posted in the same order
on every rank (MPI keeps messages between two ranks with one tag in order).

Each function takes the backend and returns the list of its pendings; the backend makes them
one call that completes once every part has.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

from mpi4py import MPI

from .._core.work import MpiPending
from .._ops import ReduceOp
from .tables import MPI_TYPE


class MpiBackendLike(Protocol):
    """What these functions use of the MPI backend (:class:`collectives._mpi.backend.MpiBackend`)."""

    rank: int
    size: int

    def broadcast(self, x: Any, name: str, root: int) -> MpiPending: ...
    def reduce(self, x: Any, out: Any, name: str, op: ReduceOp, root: int) -> MpiPending: ...
    def _post(
        self,
        start: Callable[..., MPI.Request],
        *args: Any,
        then: Callable[[], None] | None = None,
    ) -> MpiPending: ...


#: the tag of the messages these calls are made of: apart from send/recv's, so that a user's
#: message never matches a part of a collective
PARTS_TAG = 7072


def runs(array: Any, limit: int) -> list[Any]:
    """``array``'s elements as contiguous views of at most ``limit`` elements each."""
    flat = array.reshape(-1)
    return [flat[start : start + limit] for start in range(0, flat.size, limit)]


def sends(b: MpiBackendLike, array: Any, name: str, peer: int, tag: int, limit: int) -> list:
    t = MPI_TYPE[name]
    return [b._post(MPI.Comm.Isend, [run, t], peer, tag) for run in runs(array, limit)]


def recvs(b: MpiBackendLike, array: Any, name: str, peer: int, tag: int, limit: int) -> list:
    t = MPI_TYPE[name]
    return [b._post(MPI.Comm.Irecv, [run, t], peer, tag) for run in runs(array, limit)]


def all_gather(b: MpiBackendLike, x: Any, out: Any, name: str, in_place: bool) -> list[MpiPending]:
    slots = out.reshape(b.size, -1)
    if not in_place:
        slots[b.rank][...] = x.reshape(-1)
    # Rank r broadcasts its slot; the broadcasts split themselves into parts.
    return [b.broadcast(slots[r], name, r) for r in range(b.size)]


def reduce_scatter(
    b: MpiBackendLike, x: Any, out: Any, name: str, op: ReduceOp
) -> list[MpiPending]:
    blocks = x.reshape(b.size, -1)
    flat_out = out.reshape(-1)
    return [
        b.reduce(blocks[r], flat_out if r == b.rank else None, name, op, r) for r in range(b.size)
    ]


def gather(
    b: MpiBackendLike, x: Any, out: Any, name: str, root: int, in_place: bool, limit: int
) -> list[MpiPending]:
    if b.rank != root:
        return sends(b, x, name, root, PARTS_TAG, limit)
    slots = out.reshape(b.size, -1)
    if not in_place:
        slots[root][...] = x.reshape(-1)
    return [
        p for r in range(b.size) if r != root for p in recvs(b, slots[r], name, r, PARTS_TAG, limit)
    ]


def scatter(
    b: MpiBackendLike, x: Any, out: Any, name: str, root: int, in_place: bool, limit: int
) -> list[MpiPending]:
    if b.rank != root:
        return recvs(b, out, name, root, PARTS_TAG, limit)
    blocks = x.reshape(b.size, -1)
    if not in_place:
        out.reshape(-1)[...] = blocks[root]
    return [
        p
        for r in range(b.size)
        if r != root
        for p in sends(b, blocks[r], name, r, PARTS_TAG, limit)
    ]


def all_to_all(b: MpiBackendLike, x: Any, out: Any, name: str, limit: int) -> list[MpiPending]:
    # In place, the blocks sent are a copy: the ones received overwrite x as they arrive.
    blocks_x = x.reshape(b.size, -1)
    if out is x:
        blocks_x = blocks_x.copy()
    blocks_out = out.reshape(b.size, -1)
    parts = []
    for r in range(b.size):
        if r != b.rank:
            parts += recvs(b, blocks_out[r], name, r, PARTS_TAG, limit)
            parts += sends(b, blocks_x[r], name, r, PARTS_TAG, limit)
    blocks_out[b.rank][...] = blocks_x[b.rank]
    return parts
