"""``init``: bootstrap a communicator over the MPI world, on the backend that fits."""

from __future__ import annotations

import os
import warnings

from mpi4py import MPI

from . import _timeline
from ._bootstrap import MpiBootstrap
from ._core.backend import Backend
from ._core.communicator import Communicator
from ._errors import BackendUnavailableError, InvalidArgumentError
from ._mpi.backend import MpiBackend
from ._mpi.tables import blocking_by_default, mpi_tables
from ._nccl.rules import shared_gpu_reason
from ._safety import exit as _exit
from ._safety.abort import install_default
from ._safety.handshake import arrive

BACKENDS = ("auto", "nccl", "mpi")


def init(
    backend: str = "auto",
    *,
    device: int | None = None,
    timeout: float = 600.0,
    check: bool | None = None,
    mpi_blocking: bool | None = None,
) -> Communicator:
    """A new communicator over every rank of the MPI world (a world of 1 without a launcher).

    Args:
        backend: ``"nccl"`` (CuPy arrays), ``"mpi"`` (NumPy; CuPy staged through the host) or
            ``"auto"``: NCCL when every rank sees a GPU and NCCL loads, MPI otherwise, and
            MPI (with a :class:`BackendFallbackWarning` saying why) when two ranks of a
            host would share a GPU that their NCCL cannot share (before 2.30.3, or without
            ``NCCL_MULTI_RANK_GPU_ENABLE=1``). Environment ``COLLECTIVES_BACKEND``
            overrides ``"auto"``.
        device: GPU ordinal for NCCL; default ``local_rank % device_count``, made current.
        timeout: seconds after which an operation that has not completed is declared hung;
            ``init`` itself raises ``CollectiveTimeoutError`` naming the ranks that did not
            call it within that time.
        check: verify before each call that all ranks make the same call
            (default: environment ``COLLECTIVES_CHECK=1``).
        mpi_blocking: on the MPI backend, make every collective (every verb but send, recv
            and sendrecv, synchronous or not) a blocking MPI call, which is faster than a
            non-blocking one with Open MPI and Intel MPI. A stuck one then ends the job after
            ``timeout`` (printing the timeout error) instead of raising it, and a call made
            with ``async_op=True`` has completed when it returns (its ``Work`` waits for
            nothing). Default: environment ``COLLECTIVES_MPI_BLOCKING`` (``1`` or ``0``), else
            on for Open MPI and Intel MPI. Every rank must have the same setting (``init``
            raises ``InvalidArgumentError`` otherwise): MPI never matches a blocking call
            with a non-blocking one.

    Each call returns an independent communicator (as ``MPI_Comm_dup``), every rank must call it.
    The first call also does what importing collectives does not (:func:`_start`): from then
    on an uncaught exception on one rank of several ends the whole job.

    Example:
        >>> import collectives as col
        >>> with col.init() as comm:
        ...     comm.all_reduce(grad, op="avg")     # the mean over ranks, in place
        array([1., 1., 1., 1.], dtype=float32)
    """
    _start()
    if backend not in BACKENDS:
        raise InvalidArgumentError(
            f"init: backend must be one of {', '.join(BACKENDS)}, got {backend!r}"
        )
    if backend == "auto":
        backend = os.environ.get("COLLECTIVES_BACKEND", "auto") or "auto"
        if backend not in BACKENDS:
            raise InvalidArgumentError(
                f"init: COLLECTIVES_BACKEND must be one of {', '.join(BACKENDS)}, got {backend!r}"
            )
    if not isinstance(timeout, (int, float)) or not timeout > 0:
        raise InvalidArgumentError(
            f"init: timeout must be a positive number of seconds, got {timeout!r}"
        )
    if device is not None and (type(device) is not int or device < 0):
        raise InvalidArgumentError(
            f"init: device must be a non-negative int or None, got {device!r}"
        )
    if check is None:
        check = os.environ.get("COLLECTIVES_CHECK", "0") not in ("", "0")
    if mpi_blocking is not None and type(mpi_blocking) is not bool:
        raise InvalidArgumentError(
            f"init: mpi_blocking must be True, False or None, got {mpi_blocking!r}"
        )

    arrive(MPI.COMM_WORLD, "init", timeout)  # the blocking steps below wait for every rank
    mpi_comm = MPI.COMM_WORLD.Dup()
    _exit.enrol(MPI.COMM_WORLD)
    try:
        if backend in ("auto", "nccl"):
            backend, device = _choose(backend, mpi_comm, device)
    except BaseException:
        mpi_comm.Free()
        raise

    impl: Backend
    extra: dict = {}
    if backend == "mpi":
        blocking = blocking_by_default() if mpi_blocking is None else mpi_blocking
        settings = mpi_comm.allgather(blocking)
        if len(set(settings)) > 1:
            mpi_comm.Free()
            on = [r for r, b in enumerate(settings) if b]
            raise InvalidArgumentError(
                f"init: ranks {on} asked for blocking MPI collectives and the others did not "
                "(mpi_blocking, or COLLECTIVES_MPI_BLOCKING): MPI never matches a blocking "
                "call with a non-blocking one"
            )
        impl = MpiBackend(mpi_comm, blocking=blocking)
    else:
        from ._nccl.backend import make_nccl_backend

        assert device is not None  # _choose resolved it
        try:
            impl, extra = make_nccl_backend(MpiBootstrap(mpi_comm), device, timeout)
        except BaseException:
            mpi_comm.Free()
            raise
    return Communicator(impl, mpi_comm, backend=backend, timeout=timeout, check=check, **extra)


def _start() -> None:
    """What importing collectives leaves to the first ``init`` (each step once): the MPI
    backend's tables (``mpi_tables``), the timeline, then the exception and exit hooks
    (``_abort.install_default``). Exit handlers run last registered first: the exit barrier
    of :mod:`collectives._safety.exit` runs before the timeline's."""
    mpi_tables()
    _timeline.start()
    install_default()


class BackendFallbackWarning(UserWarning):
    """``init("auto")`` chose MPI although every rank has a GPU; the message says why."""


def _choose(backend: str, mpi_comm: MPI.Comm, device: int | None) -> tuple[str, int | None]:
    """The backend ``"auto"`` or ``"nccl"`` resolves to, and the GPU of this rank."""
    from ._nccl.backend import choose_device, nccl_unavailable_reason, placement

    reasons = mpi_comm.allgather(nccl_unavailable_reason())
    missing = [(r, why) for r, why in enumerate(reasons) if why is not None]
    if missing:
        if backend == "auto":
            return "mpi", device
        rank, why = missing[0]
        raise BackendUnavailableError(f"init: backend 'nccl' is unavailable on rank {rank}: {why}")
    local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
    local_rank = local.Get_rank()
    local.Free()
    found: tuple | str
    try:
        chosen = choose_device(device, local_rank)
        found = placement(chosen)
    except InvalidArgumentError as e:
        found = str(e)
    everyone = mpi_comm.allgather(found)
    errors = [f for f in everyone if isinstance(f, str)]
    if errors:  # raised on every rank, so that none waits for the others in NCCL
        raise InvalidArgumentError(errors[0])
    version = min(f[4] for f in everyone)
    why = shared_gpu_reason([f[:4] for f in everyone], version)
    if why is None:
        return "nccl", chosen
    if backend == "nccl":
        raise BackendUnavailableError(f"init: backend 'nccl' cannot run here: {why}")
    if mpi_comm.Get_rank() == 0:
        warnings.warn(
            f"init: backend 'auto' chose MPI: {why}", BackendFallbackWarning, stacklevel=3
        )
    return "mpi", device
