"""examples/ddp_mlp.py gives the same losses on several ranks as on one, for the same batch,
on arrays of the backend under test (``xp``)."""

from __future__ import annotations

import numpy as np
import pytest

WORLD_SIZES = (1, 2)
SPMD_TIMEOUT = 240


def test_example_same_losses_as_one_process(comm, xp):
    pytest.importorskip("sklearn")
    from examples.ddp_mlp import train

    kwargs = dict(epochs=2, batch=50, hidden=32, lr=0.3, limit=420, log=None, xp=xp)
    together = train(comm, **kwargs)
    alone_comm = comm.split(color=comm.rank)  # a world of one: the single-process reference
    try:
        alone = train(alone_comm, **kwargs)
    finally:
        alone_comm.close()
    assert alone_comm is not None and len(together) == 2
    for a, b in zip(together, alone):
        np.testing.assert_allclose(a["loss"], b["loss"], rtol=1e-10)
        assert a["train_acc"] == b["train_acc"] and a["test_acc"] == b["test_acc"]
    assert together[1]["loss"] < together[0]["loss"]
