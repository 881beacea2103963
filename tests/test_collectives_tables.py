"""Dtype and reduce-op tables of the collectives layer (pure logic, no communicator)."""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import collectives as col
from collectives import _dtypes, _errors, _mpi, _ops
from collectives._arrays import unwrap
from collectives._mpi_base import mpi_tables

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

# ncclDataType_t codes (nccl.h): complex travels as twice as many reals of its component type.
NCCL_CODES = {
    "int8": 0,
    "uint8": 1,
    "int32": 2,
    "uint32": 3,
    "int64": 4,
    "uint64": 5,
    "float16": 6,
    "float32": 7,
    "float64": 8,
    "bfloat16": 9,
    "complex64": 7,
    "complex128": 8,
}


def test_every_dtype_has_storage_nccl_and_mpi_types():
    names = set(SUPPORTED) | {"bfloat16"}
    assert set(_dtypes.STORAGE) == names
    assert set(_dtypes.NCCL_TYPE) == names
    mpi_tables()  # float16's MPI type is known once an MPI call has said whether MPI sums it
    assert set(_mpi.MPI_TYPE) == names
    for name in SUPPORTED:
        assert _dtypes.STORAGE[name] == np.dtype(name)
    assert _dtypes.STORAGE["bfloat16"] == np.dtype(np.uint16)
    assert _dtypes.NCCL_TYPE == NCCL_CODES


@pytest.mark.parametrize("name", [*SUPPORTED, "bfloat16"])
def test_mpi_type_moves_the_right_number_of_bytes(name):
    mpi_tables()
    mpi_type = _mpi.MPI_TYPE[name]
    assert mpi_type != MPI.DATATYPE_NULL
    assert mpi_type.Get_size() == _dtypes.STORAGE[name].itemsize


def test_nccl_op_codes_are_the_enum_values():
    assert _dtypes.NCCL_OP == {
        col.ReduceOp.SUM: 0,
        col.ReduceOp.PROD: 1,
        col.ReduceOp.MAX: 2,
        col.ReduceOp.MIN: 3,
        col.ReduceOp.AVG: 4,
    }


@pytest.mark.parametrize("name", SUPPORTED)
def test_dtype_name_of_supported_dtypes(name):
    assert _dtypes.dtype_name(np.dtype(name), "all_reduce") == name
    array, got = unwrap(np.zeros(3, name), "all_reduce")
    assert got == name and array.dtype == np.dtype(name)


def test_bfloat16_wrapper_is_named_bfloat16():
    bits = np.zeros((2, 3), np.uint16)
    array, name = unwrap(col.as_bfloat16(bits), "broadcast")
    assert name == "bfloat16" and array is bits
    assert col.as_bfloat16(bits).shape == (2, 3)
    assert col.array_module(col.as_bfloat16(bits)) is np


def test_as_bfloat16_rejects_other_dtypes():
    with pytest.raises(col.InvalidArgumentError, match=r"as_bfloat16: .*float32.*expected uint16"):
        col.as_bfloat16(np.zeros(2, np.float32))


@pytest.mark.parametrize(
    "dtype", [np.bool_, np.int16, np.uint16, np.float128 if hasattr(np, "float128") else "U3"]
)
def test_unsupported_dtype_is_a_clear_error(dtype):
    x = np.zeros(3, dtype)
    with pytest.raises(col.InvalidArgumentError) as info:
        unwrap(x, "all_reduce")
    message = str(info.value)
    assert message.startswith("all_reduce: x has dtype ")
    assert str(np.dtype(dtype)) in message
    assert "expected one of" in message and "float32" in message
    assert isinstance(info.value, ValueError)


def test_uint16_error_points_to_as_bfloat16():
    with pytest.raises(col.InvalidArgumentError, match="as_bfloat16"):
        _dtypes.dtype_name(np.dtype(np.uint16), "reduce", "out")
    with pytest.raises(col.InvalidArgumentError) as info:
        _dtypes.dtype_name(np.dtype(np.int16), "reduce", "out")
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
        (col.ReduceOp.MAX, col.ReduceOp.MAX),
        (col.ReduceOp.AVG, col.ReduceOp.AVG),
    ],
)
def test_parse_op(op, expected):
    assert _ops.parse_op(op, "all_reduce") is expected


@pytest.mark.parametrize("bad", ["mean", "", "sum ", 0, 4, None, 1.0, object()])
def test_parse_op_rejects(bad):
    with pytest.raises(col.InvalidArgumentError) as info:
        _ops.parse_op(bad, "reduce_scatter")
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
def test_complex_allows_only_sum_and_avg(name):
    _dtypes.check_op_for_dtype(col.ReduceOp.SUM, name, "all_reduce")
    _dtypes.check_op_for_dtype(col.ReduceOp.AVG, name, "all_reduce")
    for op in (col.ReduceOp.PROD, col.ReduceOp.MAX, col.ReduceOp.MIN):
        with pytest.raises(col.InvalidArgumentError) as info:
            _dtypes.check_op_for_dtype(op, name, "reduce")
        assert str(info.value) == f"reduce: op {op} is not defined for {name}, expected sum or avg"


@pytest.mark.parametrize("name", [n for n in SUPPORTED if "complex" not in n] + ["bfloat16"])
def test_real_dtypes_allow_every_op(name):
    for op in col.ReduceOp:
        _dtypes.check_op_for_dtype(op, name, "all_reduce")


def test_error_hierarchy():
    assert issubclass(col.InvalidArgumentError, col.CollectivesError)
    assert issubclass(col.InvalidArgumentError, ValueError)
    for cls in (
        col.CollectiveMismatchError,
        col.CollectiveTimeoutError,
        col.BackendUnavailableError,
    ):
        assert issubclass(cls, col.CollectivesError)
    assert issubclass(col.CollectiveTimeoutError, TimeoutError)


def test_a_failure_notice_carries_the_class_of_the_event():
    # what a rank told of another's failure raises: that rank's class (one class per event)
    public = (
        col.CollectiveTimeoutError,
        col.CollectiveMismatchError,
        col.CommunicatorStateError,
        col.InvalidArgumentError,
        col.BackendUnavailableError,
        col.CollectivesError,
    )
    for cls in public:
        assert _errors.event_class(_errors.event_name(cls("x"))) is cls

    class Private(col.CollectiveTimeoutError):
        pass

    assert _errors.event_name(Private("x")) == "CollectiveTimeoutError"  # the public class
    assert _errors.event_name(KeyError(1)) == "CommunicatorStateError"
    assert _errors.event_class("NoSuchError") is col.CommunicatorStateError
    # a timeout is no state error: ``except CommunicatorStateError`` never depends on timing
    assert not issubclass(col.CollectiveTimeoutError, col.CommunicatorStateError)
