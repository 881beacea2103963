"""The error classes of the collectives layer."""

from __future__ import annotations


class CollectivesError(RuntimeError):
    """Base class of every error raised by this library."""


class InvalidArgumentError(CollectivesError, ValueError):
    """Bad input found locally, before any communication.

    Example: ``comm.broadcast(x, root=7)`` on 4 ranks raises
    ``InvalidArgumentError("broadcast: root must be in [0, 4), got 7")``.
    """


class CommunicatorStateError(CollectivesError):
    """The communicator cannot take the call: closed, aborted, failed earlier (the message
    names the first failure), or in use by another thread. Not a ``ValueError``: the
    arguments may be fine.

    Example: ``comm.close(); comm.barrier()`` raises
    ``CommunicatorStateError("barrier: communicator is closed (rank 0)")``.
    """


class CollectiveMismatchError(CollectivesError):
    """Ranks called different collectives (op, shape, dtype, root or reduce op differ)."""


class CollectiveTimeoutError(CollectivesError, TimeoutError):
    """A collective did not complete within the communicator's timeout; the communicator is dead."""


class BackendUnavailableError(CollectivesError):
    """The requested backend cannot run here (no GPU, no NCCL, CuPy missing...)."""


# Errors are raised as their classes, the call's name first:
# ``raise InvalidArgumentError(f"send: peer must be ...")``.
