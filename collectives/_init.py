"""``init``: bootstrap a communicator over the MPI world, on the backend that fits."""

from __future__ import annotations

import os

from mpi4py import MPI

from ._communicator import Communicator
from ._errors import BackendUnavailableError, invalid
from ._mpi import MpiBackend

BACKENDS = ("auto", "nccl", "mpi")


def init(
    backend: str = "auto",
    *,
    device: int | None = None,
    timeout: float = 600.0,
    check: bool | None = None,
) -> Communicator:
    """A new communicator over every rank of the MPI world (a world of 1 without a launcher).

    Args:
        backend: ``"nccl"`` (CuPy arrays), ``"mpi"`` (NumPy; CuPy staged through the host) or
            ``"auto"``: NCCL when every rank sees a GPU and NCCL loads, MPI otherwise.
            Environment ``COLLECTIVES_BACKEND`` overrides ``"auto"``.
        device: GPU ordinal for NCCL; default ``local_rank % device_count``, made current.
        timeout: seconds after which an operation that has not completed is declared hung.
        check: verify before each call that all ranks make the same call
            (default: environment ``COLLECTIVES_CHECK=1``).

    Each call returns an independent communicator (as ``MPI_Comm_dup``), every rank must call it.

    Example:
        >>> import collectives as col
        >>> with col.init() as comm:
        ...     comm.all_reduce(x, op="avg")
    """
    if backend not in BACKENDS:
        raise invalid("init", f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "auto":
        backend = os.environ.get("COLLECTIVES_BACKEND", "auto") or "auto"
        if backend not in BACKENDS:
            raise invalid(
                "init", f"COLLECTIVES_BACKEND must be one of {', '.join(BACKENDS)}, got {backend!r}"
            )
    if not isinstance(timeout, (int, float)) or not timeout > 0:
        raise invalid("init", f"timeout must be a positive number of seconds, got {timeout!r}")
    if device is not None and (type(device) is not int or device < 0):
        raise invalid("init", f"device must be a non-negative int or None, got {device!r}")
    if check is None:
        check = os.environ.get("COLLECTIVES_CHECK", "0") not in ("", "0")

    mpi_comm = MPI.COMM_WORLD.Dup()
    if backend in ("auto", "nccl"):
        from ._nccl import nccl_unavailable_reason

        reasons = mpi_comm.allgather(nccl_unavailable_reason())
        missing = [(r, why) for r, why in enumerate(reasons) if why is not None]
        if backend == "auto":
            backend = "mpi" if missing else "nccl"
        elif missing:
            mpi_comm.Free()
            rank, why = missing[0]
            raise BackendUnavailableError(
                f"init: backend 'nccl' is unavailable on rank {rank}: {why}"
            )

    if backend == "mpi":
        return Communicator(
            MpiBackend(mpi_comm), mpi_comm, backend="mpi", timeout=timeout, check=check
        )

    from ._nccl import make_nccl_backend

    local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank = local.Get_rank()
    local.Free()
    impl, extra = make_nccl_backend(mpi_comm, device, local_rank, timeout)
    return Communicator(impl, mpi_comm, backend="nccl", timeout=timeout, check=check, **extra)
