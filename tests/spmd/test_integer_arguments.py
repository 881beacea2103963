"""A root, peer, source, color or key may be any integer (``numbers.Integral``: a NumPy
integer too), not a bool: ``root=np.int64(0)`` was refused with ``root must be an int in
[0, 1), got np.int64(0)``."""

from __future__ import annotations

import numpy as np
import pytest

import collectives as col

WORLD_SIZES = (1, 2)


@pytest.mark.parametrize("kind", [np.int64, np.int32, np.uint8], ids=lambda k: k.__name__)
def test_a_numpy_integer_root_is_taken(comm, xp, kind):
    last = kind(comm.size - 1)
    x = xp.full(3, float(comm.rank + 1))
    comm.broadcast(x, last)
    assert float(x[0]) == comm.size
    y = xp.ones(3)
    comm.reduce(y, kind(0), op="sum")
    if comm.rank == 0:
        assert float(y[0]) == comm.size
    gathered = comm.gather(xp.full(2, float(comm.rank)), root=last)
    if comm.rank == comm.size - 1:
        assert [float(v) for v in gathered[:, 0]] == list(range(comm.size))
    part = comm.scatter(xp.arange(comm.size * 2, dtype=xp.float64).reshape(comm.size, 2), last)
    assert float(part[0]) == 2 * comm.rank


def test_a_numpy_integer_peer_and_source_are_taken(comm, xp):
    right, left = np.int64((comm.rank + 1) % comm.size), np.int32((comm.rank - 1) % comm.size)
    got = comm.sendrecv(xp.full(2, float(comm.rank)), right, source=left)
    assert float(got[0]) == int(left)
    if comm.size > 1:
        x = xp.full(2, 5.0)
        if comm.rank == 0:
            comm.send(x, np.int64(1))
        elif comm.rank == 1:
            comm.recv(x, np.int64(0))
        assert float(x[0]) == 5.0


def test_a_numpy_integer_color_and_key_are_taken(comm):
    part = comm.split(np.int64(0), key=np.int32(-comm.rank))
    try:
        assert part.rank == comm.size - 1 - comm.rank
    finally:
        part.close()


@pytest.mark.parametrize("value", [True, 0.0, "0"], ids=["bool", "float", "str"])
def test_a_bool_or_non_integer_root_is_refused(comm, xp, value):
    with pytest.raises(
        col.InvalidArgumentError,
        match=rf"broadcast: root must be an int in \[0, {comm.size}\), got {value!r}",
    ):
        comm.broadcast(xp.ones(2), value)
    with pytest.raises(col.InvalidArgumentError, match=r"split: color must be"):
        comm.split(value)
