"""Weights shared by two pipeline stages (e.g. input and output embeddings)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Optional

from collectives import CommunicatorLike, InvalidArgumentError


def tied_group(
    comm: CommunicatorLike, ranks: Optional[Sequence[int]] = None
) -> Optional[CommunicatorLike]:
    """The communicator of the pipeline ranks that hold a tied weight; None on the others.

    Collective over ``comm`` (every rank calls it once, then keeps the result).
    ``ranks`` defaults to the first and last: ``(0, comm.size - 1)``.

    Example:
        >>> import pipeline
        >>> with col.DeviceMesh(comm, {"pp": comm.size}) as mesh:
        ...     tied = pipeline.tied_group(mesh["pp"])        # once
        ...     grad_embedding = np.ones(4, np.float32)       # this rank's use of the weight
        ...     pipeline.reduce_tied(tied, [grad_embedding])  # after every pipeline.run
        ...     if tied is not None:                          # None: no tied weight here
        ...         tied.close()
        >>> grad_embedding                # the sum over the holders (at one rank, one use)
        array([1., 1., 1., 1.], dtype=float32)
    """
    members = sorted({0, comm.size - 1} if ranks is None else {int(r) for r in ranks})
    if any(not 0 <= r < comm.size for r in members):
        raise InvalidArgumentError(
            f"tied_group: ranks is {list(ranks or [])}, expected ranks in [0, {comm.size})"
        )
    return comm.split(0 if comm.rank in members else None)


def reduce_tied(group: Optional[CommunicatorLike], grads: Iterable[Any]) -> None:
    """Sum each gradient in place over ``group`` (from :func:`tied_group`); None: nothing.

    Each holder of a tied weight computed the gradient of its own use of it; the weight's
    gradient is their sum, and after this every holder has it (and takes the same step).
    """
    if group is None or group.size == 1:
        return
    for grad in grads:
        group.all_reduce(grad, op="sum")
