"""What the layers above (``ddp``, ``pipeline``) need from a communicator, as a typing Protocol.

:class:`~collectives.Communicator` and :class:`~collectives.HierarchicalCommunicator` have
these members (mypy checks both, :func:`_both_conform` below); so
may any other object a caller wants to pass, a wrapper or a recording fake, without
subclassing. The verbs' signatures are ``Communicator``'s.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from ._ops import ReduceOp

if TYPE_CHECKING:
    from ._core.communicator import Communicator
    from ._topology.hierarchical import HierarchicalCommunicator


@runtime_checkable
class CommunicatorLike(Protocol):
    """The members of a communicator that ``ddp`` and ``pipeline`` use.

    ``isinstance(obj, CommunicatorLike)`` checks only that the members are there (Python's
    runtime check of a Protocol); mypy checks their types.

    Example:
        >>> def mean(comm: CommunicatorLike, x):
        ...     comm.all_reduce(x, op="avg")
        ...     return x
        >>> isinstance(comm, CommunicatorLike)
        True
        >>> mean(comm, grad)
        array([1., 1., 1., 1.], dtype=float32)
    """

    @property
    def rank(self) -> int:
        """This rank's index, 0 to ``size - 1``."""
        ...

    @property
    def size(self) -> int:
        """How many ranks."""
        ...

    @property
    def backend(self) -> str:
        """``"nccl"`` or ``"mpi"``."""
        ...

    @property
    def device(self) -> int | None:
        """The GPU of this rank on NCCL, else None."""
        ...

    @property
    def stream(self) -> Any:
        """The stream the NCCL calls run on, else None."""
        ...

    @property
    def mpi_comm(self) -> Any:
        """The MPI communicator over the same ranks (for metadata, never arrays)."""
        ...

    @property
    def xp(self) -> Any:
        """The backend's array module: ``cupy`` on NCCL, ``numpy`` on MPI."""
        ...

    def all_reduce(
        self, x: Any, op: ReduceOp | str = "sum", *, out: Any = None, async_op: bool = False
    ) -> Any: ...

    def broadcast(self, x: Any, root: int = 0, *, async_op: bool = False) -> Any: ...

    def all_gather(self, x: Any, *, out: Any = None, async_op: bool = False) -> Any: ...

    def reduce_scatter(
        self, x: Any, op: ReduceOp | str = "sum", *, out: Any = None, async_op: bool = False
    ) -> Any: ...

    def all_to_all(self, x: Any, *, out: Any = None, async_op: bool = False) -> Any: ...

    def send(self, x: Any, peer: int, *, async_op: bool = False) -> Any: ...

    def recv(self, x: Any, peer: int, *, async_op: bool = False) -> Any: ...

    def barrier(self, *, async_op: bool = False) -> Any: ...

    def group(self) -> AbstractContextManager[Any]:
        """Batch the calls inside into one launch (``with comm.group(): ...``)."""
        ...

    def split(self, color: int | None, key: int | None = None) -> CommunicatorLike | None:
        """The communicator of the ranks that pass the same ``color`` (None: no part)."""
        ...


if TYPE_CHECKING:

    def _both_conform(
        comm: Communicator, hierarchical: HierarchicalCommunicator
    ) -> tuple[CommunicatorLike, CommunicatorLike]:
        """Never called: mypy refuses it where either class stops having what ddp needs."""
        return comm, hierarchical
