"""The progress board: each rank's latest collective's number, in memory shared within a node.

A rank that times out reads the board to say which ranks never reached its call. The board is
a file in /dev/shm that every rank of the node maps and that is unlinked as soon as all have
opened it, so nothing is left behind even if the job is killed, and closing needs no
collective (which a communicator that timed out could not complete).
"""

from __future__ import annotations

import mmap
import os
import tempfile
from typing import Any

from mpi4py import MPI


class ProgressBoard:
    """``slots[local_rank]`` holds each rank's latest collective's number (the communicator
    writes its own on every collective); ``report()`` says which ranks are behind this one.

    ``check_slots`` (two per local rank) are check mode's: see ``_check``.
    """

    def __init__(self, mpi_comm: MPI.Comm):
        local = mpi_comm.Split_type(MPI.COMM_TYPE_SHARED)
        try:
            self.local_rank = local.Get_rank()
            # Each local rank's communicator rank, to name ranks as the user knows them.
            self.members: list[int] = local.allgather(mpi_comm.Get_rank())
            self.size = mpi_comm.Get_size()
            path = None
            if self.local_rank == 0:
                folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
                fd, path = tempfile.mkstemp(prefix="collectives-progress-", dir=folder)
                os.ftruncate(fd, 3 * 8 * len(self.members))
                os.close(fd)
            path = local.bcast(path, root=0)
            with open(path, "r+b") as f:
                self._map = mmap.mmap(f.fileno(), 3 * 8 * len(self.members))
            local.Barrier()
            if self.local_rank == 0:
                os.unlink(path)
        finally:
            local.Free()
        n = len(self.members)
        self._words = memoryview(self._map).cast("q")
        self.slots: Any = self._words[:n]
        self.check_slots: Any = self._words[n:]

    def report(self) -> str:
        slots = self.slots
        mine = slots[self.local_rank]
        behind = [(r, slots[i]) for i, r in enumerate(self.members) if slots[i] < mine]
        elsewhere = sorted(set(range(self.size)) - set(self.members))
        parts = []
        if behind:
            listed = ", ".join(f"rank {r} (at collective #{s})" for r, s in behind)
            parts.append(f"Ranks that have not reached collective #{mine}: {listed}.")
        else:
            parts.append(f"Every rank on this node has reached collective #{mine}.")
        if elsewhere:
            parts.append(f"Ranks on other nodes, not visible from here: {elsewhere}.")
        return " ".join(parts)

    def close(self) -> None:
        if self.slots is not None:
            for view in (self.slots, self.check_slots, self._words):
                view.release()
            self.slots = self.check_slots = None
            self._map.close()
