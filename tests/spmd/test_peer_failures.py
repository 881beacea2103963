"""One exception class per event: a rank whose call fails because another rank declared the
communicator failed raises the class that rank raised (a timeout stays a
``CollectiveTimeoutError``), whichever rank saw the event first; a later call on the dead
communicator raises ``CommunicatorStateError``.

Four ranks: rank 0 never makes the call, rank 3 times out first (a short timeout) and
declares it failed, ranks 1 and 2 (a long timeout) are told by its notice.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col

WORLD_SIZES = (4,)
SPMD_TIMEOUT = 120
SHORT, LONG = 1.0, 30.0  # rank 3's timeout, and the others'
DECLARER = 3


def _rank() -> int:
    return MPI.COMM_WORLD.Get_rank()


def _declared_by_rank_3(declare, expected: type, fragment: str, rank_0=None) -> None:
    """Rank 0 makes no collective (only ``rank_0(comm)``, where given); rank 3 runs
    ``declare(comm, x)``, which ends the communicator there; ranks 1 and 2 wait in an
    all_reduce and must raise exactly ``expected``, well before their own timeout, naming
    rank 3 and ``fragment``, and then CommunicatorStateError at their next call."""
    comm = col.init("mpi", timeout=SHORT if _rank() == DECLARER else LONG, mpi_blocking=False)
    x = np.full(3, comm.rank + 1.0)
    first = later = None
    waited = 0.0
    try:
        if comm.rank == DECLARER:
            with pytest.raises(expected):
                declare(comm, x)
        elif comm.rank == 0:
            if rank_0 is not None:
                rank_0(comm)
        else:
            start = time.monotonic()
            try:
                comm.all_reduce(x)
            except col.CollectivesError as e:
                first = e
            waited = time.monotonic() - start
            try:
                comm.barrier()
            except col.CollectivesError as e:
                later = e
    finally:
        MPI.COMM_WORLD.Barrier()  # checked after it: a rank that fails a check hangs none
        comm.close()
    if comm.rank in (0, DECLARER):
        return
    message = str(first)
    assert type(first) is expected, (type(first), message)
    assert waited < LONG / 2, waited  # told by rank 3, not timed out here
    assert message.startswith("all_reduce: communicator is unusable: rank 3 (world rank 3) ")
    assert fragment in message, message
    assert type(later) is col.CommunicatorStateError, (type(later), str(later))
    assert "unusable after an earlier error" in str(later), str(later)


def test_a_peers_timeout_is_a_timeout_on_every_rank_in_the_call():
    def declare(comm, x):
        comm.all_reduce(x)  # times out after SHORT seconds: rank 0 never calls it

    _declared_by_rank_3(
        declare,
        col.CollectiveTimeoutError,
        "declared it failed: all_reduce #1 (shape (3,), float64) on rank 3 did not complete",
    )


def test_a_peers_mpi_error_is_a_collectives_error_on_every_rank_in_the_call():
    # rank 0 sends rank 3 more than rank 3 receives: MPI reports the truncation on rank 3
    def send_too_much(comm):
        comm.send(np.ones(8), DECLARER)

    def declare(comm, x):
        comm.recv(np.empty(4), 0)

    _declared_by_rank_3(
        declare, col.CollectivesError, "declared it failed: recv: MPI error", send_too_much
    )


def test_a_peer_that_left_is_a_state_error_on_every_rank_in_the_call():
    def declare(comm, x):  # as at its exit (without a close), while the others wait
        comm.leaving("sys.exit(0)")
        raise col.CommunicatorStateError("left")

    _declared_by_rank_3(declare, col.CommunicatorStateError, "left the program (sys.exit(0))")
