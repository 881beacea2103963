"""What the backends decide without a GPU (in-process): the fallback from ranks that share a
GPU, the codes NCCL is passed for each dtype and op, the mapping of CuPy's NCCL errors, the
per-thread group bookkeeping, the deadline rule, the class a failure notice carries, and that
both backends have the same verbs.

White-box on purpose (one of the few test modules that import private names): these are
unit tests of pure internal rules and tables (``_nccl_rules``, ``_dtypes``, ``_nccl_group``,
``_errors``, ``_deadline``, the backends' verbs), most of whose cases no machine without a
GPU, or no one job, reaches through the public API.
"""

from __future__ import annotations

import inspect
import threading

import pytest

import collectives as col
from collectives import _dtypes, _errors
from collectives._core.backend import VERBS, Backend
from collectives._core.deadline import overdue
from collectives._mpi.backend import MpiBackend
from collectives._nccl import groups as _nccl_group
from collectives._nccl.backend import NcclBackend
from collectives._nccl.rules import (
    MULTI_RANK_GPU_VERSION,
    UUID_GPU_VERSION,
    cuda_error,
    event_query_done,
    nccl_error,
    shared_gpu_reason,
    version_string,
)

GPU_A, GPU_B = "0000:01:00.0", "0000:02:00.0"


def test_distinct_gpus_never_fall_back():
    placements = [("n1", GPU_A, "", None), ("n1", GPU_B, "", None), ("n2", GPU_A, "", None)]
    assert shared_gpu_reason(placements, 22907) is None


def test_a_shared_gpu_before_2_30_3_falls_back_and_names_the_ranks():
    why = shared_gpu_reason([("n1", GPU_A, "u1", "1"), ("n1", GPU_A, "u1", "1")], 23002)
    assert why is not None
    assert "ranks 0 and 1 share GPU 0000:01:00.0 on n1" in why
    assert "NCCL 2.30.2 refuses" in why


def test_a_shared_gpu_from_2_30_3_needs_the_variable_on_every_rank():
    placements = [("n1", GPU_A, "u1", "1"), ("n1", GPU_A, "u1", None)]
    unset = shared_gpu_reason(placements, MULTI_RANK_GPU_VERSION)
    assert unset is not None and "NCCL_MULTI_RANK_GPU_ENABLE is not 1 on rank 1" in unset
    assert shared_gpu_reason([("n1", GPU_A, "u1", "1")] * 2, MULTI_RANK_GPU_VERSION) is None
    assert shared_gpu_reason([("n1", GPU_A, "u1", "0")] * 2, 23007) is not None


def test_gpus_are_told_apart_by_bus_id_before_2_30_7_and_by_uuid_from_it():
    mig = [("n1", GPU_A, "u1", None), ("n1", GPU_A, "u2", None)]  # two MIG instances
    assert shared_gpu_reason(mig, 22907) is not None  # "Duplicate GPU detected"
    for version in (MULTI_RANK_GPU_VERSION, 23004, 23006):  # ncclCheckMultiRank: bus ids
        why = shared_gpu_reason(mig, version)
        assert why is not None and "NCCL_MULTI_RANK_GPU_ENABLE is not 1 on rank 0" in why
    assert shared_gpu_reason([(*p[:3], "1") for p in mig], 23006) is None
    assert UUID_GPU_VERSION == 23007
    assert shared_gpu_reason(mig, UUID_GPU_VERSION) is None
    assert shared_gpu_reason(mig, 23100) is None
    no_uuid = [("n1", GPU_A, "", None)] * 2
    assert shared_gpu_reason(no_uuid, UUID_GPU_VERSION) is not None
    one_uuid_two_buses = [("n1", GPU_A, "u1", None), ("n1", GPU_B, "u1", None)]
    assert shared_gpu_reason(one_uuid_two_buses, 23006) is None
    assert shared_gpu_reason(one_uuid_two_buses, UUID_GPU_VERSION) is not None


def test_the_same_bus_id_on_two_hosts_is_two_gpus():
    assert shared_gpu_reason([("n1", GPU_A, "u", None), ("n2", GPU_A, "u", None)], 22000) is None


def test_version_strings_of_both_encodings():
    assert version_string(23003) == "2.30.3"
    assert version_string(21805) == "2.18.5"
    assert version_string(2708) == "2.7.8"


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


def test_every_dtype_has_its_nccl_type_code():
    assert set(_dtypes.NCCL_TYPE) == set(col.DTYPES)
    assert _dtypes.NCCL_TYPE == NCCL_CODES


def test_nccl_op_codes_are_the_enum_values():
    assert _dtypes.NCCL_OP == {
        col.ReduceOp.SUM: 0,
        col.ReduceOp.PROD: 1,
        col.ReduceOp.MAX: 2,
        col.ReduceOp.MIN: 3,
        col.ReduceOp.AVG: 4,
    }


def test_a_failure_notice_carries_the_public_class_of_the_event():
    # what a rank told of another's failure raises: that rank's class (one class per event);
    # the notices of the errors no call announces (a private subclass, a stray exception)
    # are covered here, those of timeouts, MPI errors and ranks that left across ranks
    # (tests/spmd/test_peer_failures.py)
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


class _StatusError(RuntimeError):
    """The shape of CuPy's NcclError: a RuntimeError with the NCCL code in ``status``."""

    def __init__(self, status: int):
        self.status = status
        super().__init__(f"NCCL_ERROR_REMOTE_ERROR: remote process exited (code {status})")


def test_codes_cupy_cannot_name_become_collectives_errors():
    for code, name in ((7, "ncclInProgress"), (8, "ncclTimeout")):
        error = nccl_error("all_reduce", KeyError(code))
        assert isinstance(error, col.CollectivesError)
        assert str(error) == f"all_reduce: NCCL failed with {name} (code {code})"


def test_nccl_errors_and_others_become_collectives_errors():
    error = nccl_error("send", _StatusError(6))
    assert isinstance(error, col.CollectivesError)
    assert "send: NCCL failed with ncclRemoteError (code 6)" in str(error)
    other = nccl_error("split", RuntimeError("ncclCommSplit is not available in this version"))
    assert isinstance(other, col.CollectivesError) and "split" in str(other)
    already = col.InvalidArgumentError("recv: peer")
    assert nccl_error("recv", already) is already


class FakeCudaError(RuntimeError):
    def __init__(self, status):
        super().__init__(f"cudaError {status}")
        self.status = status


def test_an_event_query_is_done_not_yet_or_a_cuda_error():
    assert event_query_done(0, FakeCudaError) is True
    assert event_query_done(600, FakeCudaError) is False  # cudaErrorNotReady
    for status in (700, 719, 1):  # illegal address, launch failure, invalid value
        with pytest.raises(FakeCudaError) as raised:
            event_query_done(status, FakeCudaError)
        assert raised.value.status == status


def test_a_cuda_error_becomes_a_collectives_error_that_names_it():
    error = cuda_error("all_reduce", FakeCudaError(700))
    assert isinstance(error, col.CollectivesError)
    assert not isinstance(error, col.CollectiveTimeoutError)
    assert str(error) == "all_reduce: CUDA failed on the collectives stream: cudaError 700"


def test_group_state_holds_calls_until_the_outermost_end():
    state = _nccl_group.GroupState()
    assert state.enter() and not state.enter()  # comm A's group, then comm B's inside it
    state.hold("comm a", "send")
    state.hold("comm b", "all_reduce")
    state.then("comm b", print)
    state.wait_at_end("all_reduce")
    assert state.leave() is None and state.open  # B's end launches nothing
    batch = state.leave()
    assert batch is not None and not state.open
    assert batch.held == {"comm a": ["send"], "comm b": ["all_reduce"]}
    assert batch.owners() == ["comm a", "comm b"] and batch.waits == ["all_reduce"]
    assert state.batch.held == {}  # the next group starts empty
    with pytest.raises(RuntimeError, match="without groupStart"):
        state.leave()


def test_group_state_is_one_per_thread():
    mine = _nccl_group.current()
    assert _nccl_group.current() is mine
    seen = []
    thread = threading.Thread(target=lambda: seen.append(_nccl_group.current()))
    thread.start()
    thread.join()
    assert seen[0] is not mine


def test_one_deadline_rule():
    assert overdue(10.0, 1.5, now=11.0) is None
    assert overdue(10.0, 1.5, now=11.5) is None  # at the timeout: not yet
    assert overdue(10.0, 1.5, now=12.0) == 2.0


def test_both_backends_have_every_verb_with_the_protocols_signature():
    for verb in VERBS:
        protocol = list(inspect.signature(getattr(Backend, verb)).parameters)
        for cls in (MpiBackend, NcclBackend):
            params = list(inspect.signature(getattr(cls, verb)).parameters)
            assert params == protocol, (cls.__name__, verb, params)
    # each takes what it needs: no verb takes all of x, out, op, root and peer
    assert inspect.signature(Backend.barrier).parameters.keys() == {"self"}
    assert list(inspect.signature(Backend.recv).parameters) == ["self", "out", "name", "peer"]
    for method in ("group_start", "group_end", "split", "close", "abort"):
        assert callable(getattr(MpiBackend, method)) and callable(getattr(NcclBackend, method))


def test_mpi_work_has_no_completion_event():
    with col.init(backend="mpi", timeout=30) as comm:
        import numpy as np

        assert comm.xp is np  # the array module the backend takes
        work = comm.all_reduce(np.ones(2), async_op=True)
        assert work.event is None
        work.wait()


def test_auto_on_a_machine_without_nccl_is_mpi_without_a_warning(recwarn):
    with col.init(backend="auto", timeout=30) as comm:
        if comm.backend == "mpi":
            assert not [w for w in recwarn if issubclass(w.category, col.BackendFallbackWarning)]


def test_the_mpi_bootstrap_shares_rank_0s_value_and_its_failure():
    from mpi4py import MPI

    from collectives._bootstrap import MpiBootstrap

    boot = MpiBootstrap(MPI.COMM_WORLD)
    assert (boot.rank, boot.size) == (0, 1)
    assert boot.share(lambda: b"unique id") == b"unique id"
    assert boot.allgather(3) == [3]

    def broken() -> bytes:
        raise OSError("no network interface")

    with pytest.raises(col.BackendUnavailableError, match="OSError: no network interface"):
        boot.share(broken)
    assert boot.child(MPI.COMM_NULL) is None
    assert boot.child(MPI.COMM_SELF).size == 1


def test_torch_store_on_one_node_is_on_the_loopback_address():
    from benchmarks._baselines import _NO_TORCH_NCCL, _rendezvous

    host, port = _rendezvous(True).rsplit(":", 1)
    assert host == "127.0.0.1" and int(port) > 0
    assert {"uint32", "uint64"} <= _NO_TORCH_NCCL
