"""The interface every backend implements, and what the NCCL backend is bootstrapped with.

The front end (:class:`~collectives.Communicator`) checks arguments and keeps the books; a
backend only moves data. Every verb takes the same ``(x, out, name, op, root)``: ``x`` the
input (None where a rank sends nothing), ``out`` where the result goes (None where a rank
receives nothing), ``name`` the dtype's name, ``op`` a :class:`ReduceOp` or None, ``root``
the root or peer or None. A verb returns a :class:`Pending`. A backend that fails for good
(a timeout, an NCCL error) keeps the error in ``failure`` and raises it; the front end
then declares the communicator dead.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Protocol, TypeVar

from ._ops import ReduceOp
from ._work import Pending

T = TypeVar("T")

#: A backend verb, ``(x, out, name, op, root) -> Pending``, as :class:`Backend` lists them.
Verb = Callable[[Any, Any, Any, Any, Any], Pending]


class Backend(Protocol):
    """What :class:`~collectives.Communicator` calls. ``MpiBackend`` and ``NcclBackend``
    implement it (checked by mypy where ``_init`` builds them).

    Example:
        >>> impl: Backend = MpiBackend(mpi_comm)
        >>> pending = impl.all_reduce(x, x, "float32", ReduceOp.SUM, None)
    """

    name: str

    def all_reduce(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> Pending: ...
    def reduce(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> Pending: ...
    def broadcast(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> Pending: ...
    def all_gather(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> Pending: ...
    def reduce_scatter(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> Pending: ...
    def all_to_all(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> Pending: ...
    def gather(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> Pending: ...
    def scatter(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> Pending: ...
    def send(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> Pending: ...
    def recv(
        self, x: Any, out: Any, name: str, op: ReduceOp | None, root: int | None
    ) -> Pending: ...
    def barrier(
        self, x: Any, out: Any, name: Any, op: ReduceOp | None, root: int | None
    ) -> Pending: ...
    def group_start(self) -> None: ...
    def group_end(self, pendings: list) -> None: ...
    def split(self, child: Any, color: int | None, key: int) -> tuple[Any, dict]: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


#: The verbs (the methods that take ``x`` first), in the order above: what both backends have.
VERBS = tuple(
    name
    for name, method in vars(Backend).items()
    if callable(method) and list(inspect.signature(method).parameters)[1:2] == ["x"]
)


class Bootstrap(Protocol):
    """The host-side exchange a backend needs to create its communicators (MPI here: see
    :class:`collectives._bootstrap.MpiBootstrap`); the NCCL backend is handed one and
    starts none itself.

    Example:
        >>> uid = bootstrap.share(nccl.get_unique_id)   # rank 0's id, on every rank
    """

    rank: int
    size: int

    def share(self, make: Callable[[], T]) -> T:
        """``make()`` run on rank 0, its result (or its failure) on every rank."""
        ...

    def allgather(self, value: T) -> list[T]:
        """Every rank's ``value``, in rank order."""
        ...

    def child(self, comm: Any) -> Bootstrap | None:
        """The bootstrap over a sub-communicator the front end made (None: not a member)."""
        ...
