"""Dtypes and reduce ops as a call takes them, in-process on a communicator of one rank:
every supported dtype moves byte for byte, and every other dtype or op is refused with a
clear error before anything is communicated. (The codes the backends pass NCCL and MPI are
checked in tests/test_nccl_rules.py.)"""

from __future__ import annotations

import numpy as np
import pytest

import collectives as col

SUPPORTED = (
    "float16",
    "float32",
    "float64",
    "int8",
    "uint8",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "complex64",
    "complex128",
)
GUARD = 0xA5  # the bytes after a result, which a call must leave alone


@pytest.fixture(scope="module")
def comm():
    with col.init("mpi", timeout=30) as c:
        yield c


def _random(name: str, count: int, seed: int) -> np.ndarray:
    """``count`` elements of dtype ``name`` (uint16 bits for bfloat16) of random bytes."""
    storage = np.dtype(np.uint16 if name == "bfloat16" else name)
    raw = np.random.default_rng(seed).integers(0, 256, count * storage.itemsize, np.uint8)
    return raw.view(storage)


def _guarded(like: np.ndarray, shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    """An array of ``like``'s dtype and ``shape`` at the start of a larger buffer of GUARD
    bytes, and that buffer's bytes."""
    nbytes = like.itemsize * int(np.prod(shape))
    buffer = np.full(nbytes + 64, GUARD, np.uint8)
    return buffer[:nbytes].view(like.dtype).reshape(shape), buffer


def _wrap(a: np.ndarray, name: str):
    return col.as_bfloat16(a) if name == "bfloat16" else a


def test_the_supported_dtypes_are_the_public_list():
    assert set(col.DTYPES) == set(SUPPORTED) | {"bfloat16"}


@pytest.mark.parametrize("name", [*SUPPORTED, "bfloat16"])
def test_every_dtype_moves_byte_for_byte(comm, name):
    # the MPI datatype a dtype travels as has the dtype's size: neither fewer bytes arrive
    # nor more are written
    x = _random(name, 37, seed=len(name))
    out, buffer = _guarded(x, (1, 37))
    assert comm.all_gather(_wrap(x, name), out=_wrap(out, name)) is out
    assert out.tobytes() == x.tobytes()
    assert (buffer[x.nbytes :] == GUARD).all()
    out, buffer = _guarded(x, (37,))
    comm.scatter(_wrap(x.reshape(1, 37), name), out=_wrap(out, name), root=0)
    assert out.tobytes() == x.tobytes() and (buffer[x.nbytes :] == GUARD).all()
    record = comm.flight_record()[-1]
    assert record["dtype"] == name and record["nbytes"] == x.nbytes


def test_bfloat16_wrapper_is_sent_as_bfloat16(comm):
    bits = np.zeros((2, 3), np.uint16)
    assert comm.broadcast(col.as_bfloat16(bits)) is bits
    record = comm.flight_record()[-1]
    assert (record["dtype"], record["shape"], record["nbytes"]) == ("bfloat16", (2, 3), 12)
    assert col.as_bfloat16(bits).shape == (2, 3)
    assert col.array_module(col.as_bfloat16(bits)) is np


def test_as_bfloat16_rejects_other_dtypes():
    with pytest.raises(col.InvalidArgumentError, match=r"as_bfloat16: .*float32.*expected uint16"):
        col.as_bfloat16(np.zeros(2, np.float32))


@pytest.mark.parametrize(
    "dtype", [np.bool_, np.int16, np.uint16, np.float128 if hasattr(np, "float128") else "U3"]
)
def test_unsupported_dtype_is_a_clear_error(comm, dtype):
    x = np.zeros(3, dtype)
    calls = len(comm.flight_record())
    with pytest.raises(col.InvalidArgumentError) as info:
        comm.all_reduce(x)
    message = str(info.value)
    assert message.startswith("all_reduce: x has dtype ")
    assert str(np.dtype(dtype)) in message
    assert "expected one of" in message and "float32" in message
    assert isinstance(info.value, ValueError)
    assert len(comm.flight_record()) == calls  # refused before the call was made


def test_uint16_error_points_to_as_bfloat16(comm):
    with pytest.raises(col.InvalidArgumentError, match="as_bfloat16"):
        comm.reduce(np.zeros(3, np.float32), out=np.zeros(3, np.uint16))
    with pytest.raises(col.InvalidArgumentError) as info:
        comm.reduce(np.zeros(3, np.float32), out=np.zeros(3, np.int16))
    assert "as_bfloat16" not in str(info.value)
    assert str(info.value).startswith("reduce: out has dtype int16")


@pytest.mark.parametrize(
    "op,expected",
    [
        ("sum", col.ReduceOp.SUM),
        ("prod", col.ReduceOp.PROD),
        ("max", col.ReduceOp.MAX),
        ("min", col.ReduceOp.MIN),
        ("avg", col.ReduceOp.AVG),
        ("SUM", col.ReduceOp.SUM),
        ("Avg", col.ReduceOp.AVG),
        ("Max", col.ReduceOp.MAX),
        (col.ReduceOp.MAX, col.ReduceOp.MAX),
        (col.ReduceOp.AVG, col.ReduceOp.AVG),
    ],
)
def test_op_names_in_any_case_and_the_enum_are_taken(comm, op, expected):
    x = np.arange(3.0)
    assert comm.all_reduce(x, op=op) is x
    np.testing.assert_array_equal(x, np.arange(3.0))  # one rank: every op leaves x as it is
    # complex data takes sum and avg only, and the refusal names the op the name stands for
    z = np.ones(2, np.complex64)
    if expected in (col.ReduceOp.SUM, col.ReduceOp.AVG):
        comm.all_reduce(z, op=op)
    else:
        with pytest.raises(col.InvalidArgumentError, match=f"op {expected} is not defined"):
            comm.all_reduce(z, op=op)


@pytest.mark.parametrize("bad", ["mean", "", "sum ", 0, 4, None, 1.0, object()])
def test_other_ops_are_refused(comm, bad):
    with pytest.raises(col.InvalidArgumentError) as info:
        comm.reduce_scatter(np.ones((1, 2)), op=bad)
    message = str(info.value)
    assert message.startswith("reduce_scatter: op must be one of sum, prod, max, min, avg")
    assert repr(bad) in message


def test_reduce_op_values_and_str():
    assert [(op.name, int(op)) for op in col.ReduceOp] == [
        ("SUM", 0),
        ("PROD", 1),
        ("MAX", 2),
        ("MIN", 3),
        ("AVG", 4),
    ]
    assert [str(op) for op in col.ReduceOp] == ["sum", "prod", "max", "min", "avg"]


@pytest.mark.parametrize("name", ["complex64", "complex128"])
def test_complex_allows_only_sum_and_avg(comm, name):
    z = np.full(3, 1 + 2j, name)
    comm.all_reduce(z, op=col.ReduceOp.SUM)
    comm.all_reduce(z, op=col.ReduceOp.AVG)
    np.testing.assert_array_equal(z, np.full(3, 1 + 2j, name))
    for op in (col.ReduceOp.PROD, col.ReduceOp.MAX, col.ReduceOp.MIN):
        with pytest.raises(col.InvalidArgumentError) as info:
            comm.reduce(z, op=op)
        assert str(info.value) == f"reduce: op {op} is not defined for {name}, expected sum or avg"


@pytest.mark.parametrize("name", [n for n in SUPPORTED if "complex" not in n] + ["bfloat16"])
def test_real_dtypes_allow_every_op(comm, name):
    for op in col.ReduceOp:
        if name == "bfloat16":  # 0, 1, 2, 3: exact in bfloat16
            x = (np.arange(4, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
        else:
            x = np.arange(4, dtype=name)
        given = x.copy()
        comm.all_reduce(_wrap(x, name), op=op)
        np.testing.assert_array_equal(x, given)


def test_error_hierarchy():
    assert issubclass(col.InvalidArgumentError, col.CollectivesError)
    assert issubclass(col.InvalidArgumentError, ValueError)
    for cls in (
        col.CollectiveMismatchError,
        col.CollectiveTimeoutError,
        col.BackendUnavailableError,
        col.CommunicatorStateError,
    ):
        assert issubclass(cls, col.CollectivesError)
    assert issubclass(col.CollectiveTimeoutError, TimeoutError)
    # a timeout is no state error: ``except CommunicatorStateError`` never depends on timing
    assert not issubclass(col.CollectiveTimeoutError, col.CommunicatorStateError)
