"""The MPI bootstrap ``init`` hands to the NCCL backend: the unique id and small agreements
travel over an mpi4py communicator that the front end owns (and frees)."""

from __future__ import annotations

from typing import Any, Callable, TypeVar

from mpi4py import MPI

from ._errors import BackendUnavailableError

T = TypeVar("T")


class MpiBootstrap:
    """:class:`collectives._core.backend.Bootstrap` over ``mpi_comm`` (not owned: never freed here).

    Example:
        >>> boot = MpiBootstrap(MPI.COMM_WORLD)
        >>> boot.share(lambda: "made on rank 0")   # the NCCL backend shares nccl.get_unique_id()
        'made on rank 0'
        >>> boot.allgather(boot.rank)              # every rank's value, in rank order
        [0]
    """

    def __init__(self, mpi_comm: MPI.Comm):
        self.mpi = mpi_comm
        self.rank: int = mpi_comm.Get_rank()
        self.size: int = mpi_comm.Get_size()

    def share(self, make: Callable[[], T]) -> T:
        value: Any = None
        error = None
        if self.rank == 0:
            # Rank 0's failure travels too: the others would otherwise wait in bcast forever.
            try:
                value = make()
            except Exception as e:
                error = f"{type(e).__name__}: {e}"
        value, error = self.mpi.bcast((value, error), root=0)
        if error is not None:
            raise BackendUnavailableError(
                f"init: rank 0 could not make the NCCL unique id: {error}"
            )
        return value

    def allgather(self, value: T) -> list[T]:
        return self.mpi.allgather(value)

    def child(self, comm: Any) -> MpiBootstrap | None:
        return None if comm == MPI.COMM_NULL else MpiBootstrap(comm)
