"""``cupy.cuda.nccl`` of CuPy 14.2 over NCCL 2.30, emulated: every communicator is a real
group of processes, and the data moves between them over MPI.

What is modelled, from CuPy's ``cupy_backends/cuda/libs/nccl.pyx`` and NCCL's sources:

- CuPy's signatures (raw pointers, counts in elements, ints for dtype, op and stream),
  ``NcclError`` (codes 0-6 named; 7 and 8 raise ``KeyError`` as CuPy's table lacks them),
  ``commId`` as 128 bytes, ``commSplit`` (None for color -1), ``abort``/``destroy``, and
  every call on a destroyed or aborted communicator failing with ``ncclInvalidArgument``.
- NCCL's argument checks at the call (datatype, op, root, peer), and pointers checked only
  when the kernel runs: memory that is not the communicator's device's faults the device
  (``cudaErrorIllegalAddress``, sticky), as a kernel given it would.
- Stream order: a call is queued on the stream given and completes only once every member
  has launched its part (nothing is buffered on a peer's behalf).
- Groups: the depth is per host thread; calls inside are launched together at the
  outermost ``groupEnd`` (so send/recv pairs cannot deadlock).
- Lazy connect (``NCCL_RUNTIME_CONNECT=1``, NCCL's default): the first call that needs a
  peer blocks the calling host thread until that peer has made a call that needs it too;
  ``NCCL_RUNTIME_CONNECT=0`` connects every pair at creation.
- Placement: two members on one GPU are refused ("Duplicate GPU detected",
  ``ncclInvalidUsage``) unless ``NCCL_MULTI_RANK_GPU_ENABLE=1``, and then at most two.

Reductions are computed in rank order on every member, so every member gets the same bits;
max/min are ``fmax``/``fmin`` (a NaN loses to a number, as NCCL's ``fmaxf``); avg multiplies
floats by 1/n before summing and divides integers after (NCCL's PreMulSum / SumPostDiv).
"""

from __future__ import annotations

import atexit
import itertools
import os
import secrets
import socket
import struct
import threading
import time
import weakref
from typing import Any

import numpy as np
from mpi4py import MPI

from . import _gpu
from ._objects import _STREAMS_BY_PTR, Device, _null_queue

available = True

NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN, NCCL_AVG = 0, 1, 2, 3, 4
NCCL_INT8 = NCCL_CHAR = 0
NCCL_UINT8 = 1
NCCL_INT32 = NCCL_INT = 2
NCCL_UINT32 = 3
NCCL_INT64 = 4
NCCL_UINT64 = 5
NCCL_FLOAT16 = NCCL_HALF = 6
NCCL_FLOAT32 = NCCL_FLOAT = 7
NCCL_FLOAT64 = NCCL_DOUBLE = 8
NCCL_BFLOAT16 = 9
NCCL_SPLIT_NOCOLOR = -1

#: the NCCL this emulates: 2.30.4 (two ranks may share a GPU with NCCL_MULTI_RANK_GPU_ENABLE=1)
VERSION = 23004
NCCL_UNIQUE_ID_BYTES = 128

_NAMES = {  # CuPy's ERROR2: no entry for 7 (in progress) or 8 (timeout)
    0: "NCCL_ERROR_SUCCESS",
    1: "NCCL_ERROR_UNHANDLED_CUDA_ERROR",
    2: "NCCL_ERROR_SYSTEM_ERROR",
    3: "NCCL_ERROR_INTERNAL_ERROR",
    4: "NCCL_ERROR_INVALID_ARGUMENT",
    5: "NCCL_ERROR_INVALID_USAGE",
    6: "NCCL_ERROR_REMOTE_ERROR",
}
_STRINGS = {  # ncclGetErrorString
    0: "no error",
    1: "unhandled cuda error (run with NCCL_DEBUG=INFO for details)",
    2: "unhandled system error (run with NCCL_DEBUG=INFO for details)",
    3: "internal error - please report this issue to the NCCL developers",
    4: "invalid argument (run with NCCL_DEBUG=WARN for details)",
    5: "invalid usage (run with NCCL_DEBUG=WARN for details)",
    6: "remote process exited or there was a network error",
    7: "NCCL operation in progress",
    8: "NCCL timeout",
}


class NcclError(RuntimeError):
    """CuPy's: ``status`` and ``"<NAME>: <ncclGetErrorString>"``; a status CuPy's table
    does not name (7, 8) raises ``KeyError`` while the error is being made."""

    def __init__(self, status: int):
        self.status = status
        super().__init__(f"{_NAMES[status]}: {_STRINGS.get(status, 'unknown result')}")

    def __reduce__(self) -> tuple:
        return (type(self), (self.status,))


def check_status(status: int) -> None:
    if status != 0:
        raise NcclError(status)


def get_build_version() -> int:
    return VERSION


def get_version() -> int:
    return VERSION


_DTYPES: dict[int, Any] = {
    0: np.int8, 1: np.uint8, 2: np.int32, 3: np.uint32, 4: np.int64, 5: np.uint64,
    6: np.float16, 7: np.float32, 8: np.float64,
}  # fmt: skip
try:
    import ml_dtypes

    _DTYPES[9] = ml_dtypes.bfloat16
except ImportError:  # bfloat16 reductions then fail as an unsupported type would
    pass


def _bytesize(datatype: int) -> int:
    return 2 if datatype == NCCL_BFLOAT16 else np.dtype(_DTYPES[datatype]).itemsize


# ---------------------------------------------------------------- the rendezvous

_WORLD = MPI.COMM_WORLD
_JOIN_TAG, _VERDICT_TAG, _GROUP_TAG = 30701, 30702, 30703
_CONNECT_TAG, _P2P_TAG = 30704, 30705
_COUNTER = itertools.count()
_MAILBOX: dict[tuple[int, bytes], list] = {}
_MAILBOX_LOCK = threading.Lock()
_POLL_S = 2e-4


def get_unique_id() -> bytes:
    """128 bytes naming this process (its world rank) as the rendezvous root."""
    head = b"EMUNCCL1" + struct.pack("<iqq", _WORLD.Get_rank(), os.getpid(), next(_COUNTER))
    return head + secrets.token_bytes(NCCL_UNIQUE_ID_BYTES - len(head))


def _receive(tag: int, uid: bytes, source: int = MPI.ANY_SOURCE) -> Any:
    """The next message with ``tag`` about ``uid`` (others are kept for their readers)."""
    while True:
        with _MAILBOX_LOCK:
            kept = _MAILBOX.get((tag, uid))
            if kept:
                return kept.pop(0)
            message = _WORLD.improbe(source=source, tag=tag)
            if message is not None:
                their_uid, body = message.recv()
                if their_uid == uid:
                    return body
                _MAILBOX.setdefault((tag, their_uid), []).append(body)
                continue
        time.sleep(_POLL_S)


def _rendezvous(ndev: int, uid: bytes, rank: int, device: int) -> tuple[Any, list]:
    """Every member's (world rank, host, bus id, multi-rank setting) in NCCL rank order, and
    an MPI communicator of the members in that order. The uid's maker collects and decides
    (as NCCL's bootstrap root does); it must be a member."""
    root = struct.unpack("<i", uid[8:12])[0]
    me = (_WORLD.Get_rank(), socket.gethostname(), Device(device).pci_bus_id,
          os.environ.get("NCCL_MULTI_RANK_GPU_ENABLE"))  # fmt: skip
    if ndev == 1:
        return _WORLD.Create_group(_WORLD.group.Incl([me[0]]), _GROUP_TAG), [me]
    if _WORLD.Get_rank() != root:
        _WORLD.send((uid, (rank, me)), dest=root, tag=_JOIN_TAG)
        verdict = _receive(_VERDICT_TAG, uid, source=root)
    else:
        members: dict[int, tuple] = {rank: me}
        while len(members) < ndev:
            their_rank, info = _receive(_JOIN_TAG, uid)
            members[their_rank] = info
        placed = [members.get(r) for r in range(ndev)]
        verdict = _placement_error(placed) or placed
        for info in members.values():
            if info[0] != me[0]:
                _WORLD.send((uid, verdict), dest=info[0], tag=_VERDICT_TAG)
    if isinstance(verdict, int):
        raise NcclError(verdict)
    group = _WORLD.group.Incl([info[0] for info in verdict])
    return _WORLD.Create_group(group, _GROUP_TAG), verdict


def _placement_error(placed: list) -> int:
    """ncclInvalidUsage for members sharing a GPU that NCCL would refuse, else 0."""
    if any(p is None for p in placed):
        return 4  # a rank was given twice: ncclInvalidArgument
    per_gpu: dict[tuple, list] = {}
    for info in placed:
        per_gpu.setdefault((info[1], info[2]), []).append(info[3])
    for settings in per_gpu.values():
        if len(settings) > 1 and (any(s != "1" for s in settings) or len(settings) > 2):
            return 5  # "Duplicate GPU detected" / more than NCCL's multi-rank mode takes
    return 0


# ---------------------------------------------------------------- groups

_LOCAL = threading.local()


def _group() -> list:
    if not hasattr(_LOCAL, "depth"):
        _LOCAL.depth, _LOCAL.calls = 0, []
    return _LOCAL.calls


def groupStart() -> None:
    _group()
    _LOCAL.depth += 1


def groupEnd() -> None:
    calls = _group()
    if _LOCAL.depth == 0:
        raise NcclError(5)  # ncclGroupEnd without ncclGroupStart
    _LOCAL.depth -= 1
    if _LOCAL.depth:
        return
    _LOCAL.calls = []
    launches: dict[tuple[int, int], tuple[Any, Any, list]] = {}
    for state, queue, call in calls:
        launches.setdefault((id(state), id(queue)), (state, queue, []))[2].append(call)
    for state, _, batch in launches.values():
        state.connect(set().union(*(call.peers(state) for call in batch)))
    for state, queue, batch in launches.values():
        queue.put("work", _Launch(state, batch))


class NcclConfig:
    """``NcclConfig(split_share=0)``: CuPy exposes only ``split_share``."""

    def __init__(self, split_share: int = 0):
        self._split_share = split_share

    @property
    def split_share(self) -> int:
        return self._split_share


# ---------------------------------------------------------------- a communicator's state


class _State:
    """The members' MPI communicator, which peers are connected, and the abort flag."""

    def __init__(self, mpi: Any, rank: int, size: int, device: int):
        self.mpi = mpi
        self.rank = rank
        self.size = size
        self.device = device
        self.aborted = False
        self.async_error = 0
        self.connected: set[int] = {rank}
        self.kept: list = []  # buffers of requests an abort left behind (MPI may still write)
        _STATES.add(self)
        if os.environ.get("NCCL_RUNTIME_CONNECT", "1") == "0":
            self.connect(set(range(size)))

    def connect(self, peers: set[int]) -> None:
        """Block this host thread until every peer in ``peers`` has asked for us too."""
        wanted = sorted(peers - self.connected)
        if not wanted:
            return
        tokens = [np.zeros(1, np.uint8) for _ in wanted]
        requests = []
        for peer, token in zip(wanted, tokens):
            requests.append(self.mpi.Isend(np.ones(1, np.uint8), dest=peer, tag=_CONNECT_TAG))
            requests.append(self.mpi.Irecv(token, source=peer, tag=_CONNECT_TAG))
        while not MPI.Request.Testall(requests):
            if self.aborted:
                self.kept.append((requests, tokens))
                return
            time.sleep(_POLL_S)
        self.connected.update(wanted)


_STATES: weakref.WeakSet = weakref.WeakSet()
#: how long the process's exit waits for the streams to run what is queued on them
EXIT_DRAIN_S = 10.0


@atexit.register  # registered after mpi4py's MPI_Finalize, so it runs before it
def _at_exit() -> None:
    """The process ends: let the streams run what was queued (bounded), then stop every
    communicator's transfers, so that no stream is inside MPI when MPI finalizes."""
    from ._objects import _ALL_QUEUES

    deadline = time.monotonic() + EXIT_DRAIN_S
    for queue in list(_ALL_QUEUES):
        queue.record().wait(max(0.0, deadline - time.monotonic()))
    for state in list(_STATES):
        state.aborted = True


class _Call:
    """One NCCL call: its kind, buffers (pointers), count, datatype, op, root or peer."""

    def __init__(self, kind: str, send: int, recv: int, count: int, datatype: int,
                 op: int = 0, root: int = -1):  # fmt: skip
        self.kind, self.send, self.recv = kind, send, recv
        self.count, self.datatype, self.op, self.root = count, datatype, op, root

    def peers(self, state: _State) -> set[int]:
        if self.kind in ("send", "recv"):
            return {self.root}
        return set(range(state.size))

    def __repr__(self) -> str:
        return f"nccl {self.kind}(count={self.count}, datatype={self.datatype})"


class _Launch:
    """What one stream runs for a call or a group's calls on one communicator: every
    transfer started, then waited for, then the reductions."""

    def __init__(self, state: _State, calls: list[_Call]):
        self.state = state
        self.calls = calls

    def __call__(self) -> None:
        state = self.state
        if state.aborted:
            return
        steps = [self._start(call) for call in self.calls]
        requests = [r for requests, _ in steps for r in requests]
        while requests and not MPI.Request.Testall(requests):
            if state.aborted:  # NCCL's abort ends the kernels; what they wrote is undefined
                state.kept.append(steps)
                return
            time.sleep(_POLL_S)
        for _, finish in steps:
            if finish is not None:
                finish()

    def _bytes(self, ptr: int, count: int, call: _Call) -> np.ndarray:
        nbytes = count * _bytesize(call.datatype)
        return _gpu.device_bytes(ptr, nbytes, self.state.device, repr(call))

    def _start(self, call: _Call) -> tuple[list, Any]:
        state, n, count = self.state, self.state.size, call.count
        mpi = state.mpi
        if call.kind == "send":
            data = self._bytes(call.send, count, call).copy()
            return [mpi.Isend(data, dest=call.root, tag=_P2P_TAG)], None
        if call.kind == "recv":
            target = self._bytes(call.recv, count, call)
            landing = np.empty_like(target)
            return [mpi.Irecv(landing, source=call.root, tag=_P2P_TAG)], lambda: np.copyto(
                target, landing
            )
        if call.kind == "broadcast":
            source = self._bytes(call.send, count, call) if state.rank == call.root else None
            target = self._bytes(call.recv, count, call)
            landing = source.copy() if source is not None else np.empty_like(target)
            requests = [mpi.Ibcast(landing, root=call.root), mpi.Ibarrier()]
            return requests, lambda: np.copyto(target, landing)
        if call.kind == "allGather":
            source = self._bytes(call.send, count, call).copy()
            target = self._bytes(call.recv, count * n, call)
            landing = np.empty_like(target)
            return [mpi.Iallgather(source, landing)], lambda: np.copyto(target, landing)
        # reductions: every member's contribution, reduced here in rank order
        if call.kind == "reduceScatter":
            source = self._bytes(call.send, count * n, call).copy()
            target = self._bytes(call.recv, count, call)
            landing = np.empty_like(source)
            requests = [mpi.Ialltoall(source, landing)]
        else:  # allReduce, reduce
            source = self._bytes(call.send, count, call).copy()
            target = self._bytes(call.recv, count, call) if (
                call.kind == "allReduce" or state.rank == call.root
            ) else None  # fmt: skip
            landing = np.empty(source.size * n, np.uint8)
            requests = [mpi.Iallgather(source, landing)]

        def finish() -> None:
            if target is not None:
                parts = landing.view(_DTYPES[call.datatype]).reshape(n, -1)
                np.copyto(target, _reduce(parts, call.op).view(np.uint8).reshape(-1))

        return requests, finish


def _reduce(parts: np.ndarray, op: int) -> np.ndarray:
    """``parts[0] op parts[1] op ...`` in rank order, in the parts' own type."""
    n = parts.shape[0]
    floating = parts.dtype.kind == "f" or parts.dtype.name == "bfloat16"
    if op == NCCL_AVG and floating:
        parts = parts * parts.dtype.type(1.0 / n)
    combine = {
        NCCL_SUM: np.add, NCCL_AVG: np.add, NCCL_PROD: np.multiply,
        NCCL_MAX: np.fmax if floating else np.maximum,
        NCCL_MIN: np.fmin if floating else np.minimum,
    }[op]  # fmt: skip
    result = parts[0].copy()
    for part in parts[1:]:
        combine(result, part, out=result)
    if op == NCCL_AVG and not floating:
        result = _int_divide(result, n)
    return result


def _int_divide(values: np.ndarray, n: int) -> np.ndarray:
    """C's integer division (toward zero), as NCCL's SumPostDiv."""
    if values.dtype.kind == "u":
        return values // values.dtype.type(n)
    divisor = values.dtype.type(n)
    # floor division, then one up where a negative value left a remainder: no abs(), which
    # wraps at the type's most negative value
    quotient = values // divisor
    return (quotient + ((values < 0) & (values % divisor != 0))).astype(values.dtype)


# ---------------------------------------------------------------- the communicator


class NcclCommunicator:
    """``NcclCommunicator(ndev, commId, rank, config=None)``: this process's member of a
    communicator of ``ndev`` ranks on the current device; collective over its members."""

    def __init__(self, ndev: int, commId: bytes, rank: int, config: NcclConfig | None = None):
        if not isinstance(commId, bytes):
            raise TypeError(
                f"Argument 'commId' has incorrect type (expected bytes, got {type(commId).__name__})"
            )
        if len(commId) != NCCL_UNIQUE_ID_BYTES:
            raise ValueError(f"commId length {len(commId)} != {NCCL_UNIQUE_ID_BYTES}.")
        if ndev < 1 or not 0 <= rank < ndev:
            raise NcclError(4)
        device = _gpu.current_device()
        _gpu.raise_if_faulted(device)
        mpi, _ = _rendezvous(int(ndev), commId, int(rank), device)
        self._state: _State | None = _State(mpi, int(rank), int(ndev), device)
        self._lock = threading.Lock()

    @classmethod
    def _of(cls, state: _State) -> NcclCommunicator:
        comm = cls.__new__(cls)
        comm._state, comm._lock = state, threading.Lock()
        return comm

    @property
    def comm(self) -> int:
        return 0 if self._state is None else id(self._state)

    def _live(self) -> _State:
        if self._state is None:
            raise NcclError(4)  # NULL communicator
        return self._state

    def device_id(self) -> int:
        return self._live().device

    def rank_id(self) -> int:
        return self._live().rank

    def size(self) -> int:
        return self._live().size

    # ------------------------------------------------------------ calls

    def _call(self, call: _Call, stream: int) -> None:
        state = self._live()
        if state.async_error:
            raise NcclError(state.async_error)
        if call.count < 0:
            raise OverflowError("can't convert negative value to size_t")
        if call.datatype not in range(10) or call.datatype not in _DTYPES:
            raise NcclError(4)
        if call.op not in range(5):
            raise NcclError(4)
        if call.kind in ("reduce", "broadcast", "send", "recv") and not 0 <= call.root < state.size:
            raise NcclError(4)
        _gpu.raise_if_faulted(state.device)
        queue = _queue_of(stream, state.device)
        if queue is None:
            raise NcclError(1)  # an invalid stream: cudaErrorInvalidResourceHandle
        if getattr(_LOCAL, "depth", 0):
            _group().append((state, queue, call))
            return
        state.connect(call.peers(state))
        queue.put("work", _Launch(state, [call]))

    def allReduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int,
                  stream: int) -> None:  # fmt: skip
        self._call(_Call("allReduce", sendbuf, recvbuf, count, datatype, op), stream)

    def reduce(self, sendbuf: int, recvbuf: int, count: int, datatype: int, op: int, root: int,
               stream: int) -> None:  # fmt: skip
        self._call(_Call("reduce", sendbuf, recvbuf, count, datatype, op, root), stream)

    def broadcast(self, sendbuff: int, recvbuff: int, count: int, datatype: int, root: int,
                  stream: int) -> None:  # fmt: skip
        self._call(_Call("broadcast", sendbuff, recvbuff, count, datatype, 0, root), stream)

    def bcast(self, buff: int, count: int, datatype: int, root: int, stream: int) -> None:
        self.broadcast(buff, buff, count, datatype, root, stream)

    def reduceScatter(self, sendbuf: int, recvbuf: int, recvcount: int, datatype: int, op: int,
                      stream: int) -> None:  # fmt: skip
        self._call(_Call("reduceScatter", sendbuf, recvbuf, recvcount, datatype, op), stream)

    def allGather(self, sendbuf: int, recvbuf: int, count: int, datatype: int,
                  stream: int) -> None:  # fmt: skip
        self._call(_Call("allGather", sendbuf, recvbuf, count, datatype), stream)

    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._call(_Call("send", sendbuf, 0, count, datatype, 0, peer), stream)

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._call(_Call("recv", 0, recvbuf, count, datatype, 0, peer), stream)

    # ------------------------------------------------------------ lifetime

    def check_async_error(self) -> None:
        state = self._live()
        check_status(state.async_error)

    def commSplit(self, color: int, key: int, config: NcclConfig | None = None) -> Any:
        """Collective over this communicator's members; None for color -1."""
        state = self._live()
        child = state.mpi.Split(MPI.UNDEFINED if color == NCCL_SPLIT_NOCOLOR else color, key)
        if child == MPI.COMM_NULL:
            return None
        return NcclCommunicator._of(_State(child, child.Get_rank(), child.Get_size(), state.device))

    def destroy(self) -> None:
        """Free this member (collective within a node in NCCL: every member calls it)."""
        with self._lock:
            state, self._state = self._state, None
        if state is not None and not state.kept and not MPI.Is_finalized():
            state.mpi.Free()

    def abort(self) -> None:
        """End the communicator's calls in flight now; what they wrote is undefined."""
        with self._lock:
            state, self._state = self._state, None
        if state is not None:
            state.aborted = True

    def __del__(self) -> None:
        try:
            self.destroy()
        except Exception:
            pass

    @staticmethod
    def initAll(devices: Any) -> list:
        raise NotImplementedError("the emulation runs one device per process (no initAll)")


def _queue_of(stream: int, device: int) -> Any:
    if stream == 0:
        return _null_queue(device)
    found = _STREAMS_BY_PTR.get(stream)
    return None if found is None else found._queue()
