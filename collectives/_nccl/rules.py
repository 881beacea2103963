"""Pure decisions of the NCCL backend, testable without a GPU: whether ranks that share a
GPU can run NCCL, and how NCCL's errors (as CuPy raises them) become ours."""

from __future__ import annotations

from typing import Callable

from .._errors import CollectivesError

#: First NCCL release that can put two ranks on one GPU (``NCCL_MULTI_RANK_GPU_ENABLE=1``);
#: earlier ones stop communicator creation with "Duplicate GPU detected" (src/init.cc).
MULTI_RANK_GPU_VERSION = 23003
#: First NCCL release that tells the GPUs of one host apart by UUID (src/init.cc); 2.30.3 to
#: 2.30.6 compare PCI bus ids (src/graph/topo.cc, ncclCheckMultiRank).
UUID_GPU_VERSION = 23007

#: ncclResult_t (nccl.h) by code. CuPy's NcclError names only 0 to 6 and raises KeyError for
#: the others while building its message.
NCCL_RESULT = {
    0: "ncclSuccess",
    1: "ncclUnhandledCudaError",
    2: "ncclSystemError",
    3: "ncclInternalError",
    4: "ncclInvalidArgument",
    5: "ncclInvalidUsage",
    6: "ncclRemoteError",
    7: "ncclInProgress",
    8: "ncclTimeout",
}


def version_string(code: int) -> str:
    """``23003`` -> ``"2.30.3"`` (codes before 2.9 were major*1000 + minor*100 + patch)."""
    if code >= 20900:
        return f"{code // 10000}.{code // 100 % 100}.{code % 100}"
    return f"{code // 1000}.{code // 100 % 10}.{code % 100}"


def shared_gpu_reason(
    placements: list[tuple[str, str, str, str | None]], version: int
) -> str | None:
    """Why NCCL cannot run with this placement of ranks, or None when it can.

    ``placements[r]`` is rank r's (host, GPU PCI bus id, GPU UUID, its
    ``NCCL_MULTI_RANK_GPU_ENABLE``). As NCCL decides: before 2.30.3 two ranks of one host on
    one bus id are refused ("Duplicate GPU detected"); from 2.30.3 two on one GPU are, unless
    ``NCCL_MULTI_RANK_GPU_ENABLE=1``, where 2.30.3 to 2.30.6 tell GPUs apart by bus id and
    2.30.7 onwards by UUID (an empty UUID: the bus id).

    Example:
        >>> shared_gpu_reason([("n1", "0000:01:00.0", "", "1")] * 2, 23003) is None
        True
        >>> shared_gpu_reason([("n1", "0000:01:00.0", "", None)] * 2, 22907)[:40]
        'ranks 0 and 1 share GPU 0000:01:00.0 on '
    """
    multi = version >= MULTI_RANK_GPU_VERSION
    by_uuid = version >= UUID_GPU_VERSION
    seen: dict[tuple[str, str], int] = {}
    for rank, (host, bus, uuid, _) in enumerate(placements):
        first = seen.setdefault((host, (uuid or bus) if by_uuid else bus), rank)
        if first == rank:
            continue
        where = f"ranks {first} and {rank} share GPU {bus} on {host}"
        if not multi:
            return (
                f"{where}, which NCCL {version_string(version)} refuses (NCCL 2.30.3 or "
                "later allows it with NCCL_MULTI_RANK_GPU_ENABLE=1)"
            )
        unset = [r for r, (*_, env) in enumerate(placements) if env != "1"]
        if unset:
            return (
                f"{where} and NCCL_MULTI_RANK_GPU_ENABLE is not 1 on rank {unset[0]} "
                f"(NCCL {version_string(version)} allows it only when it is)"
            )
        return None
    return None


#: cudaEventQuery's results that are not errors: complete, and not yet complete.
CUDA_SUCCESS, CUDA_ERROR_NOT_READY = 0, 600


def event_query_done(status: int, error: Callable[[int], Exception]) -> bool:
    """Whether ``cudaEventQuery``'s ``status`` says the event has completed. Any status other
    than success or not-ready is a CUDA error (after a kernel fault every query returns it,
    e.g. 700): raise ``error(status)`` rather than report it as "not yet".

    Example:
        >>> event_query_done(600, RuntimeError)
        False
    """
    if status == CUDA_SUCCESS:
        return True
    if status == CUDA_ERROR_NOT_READY:
        return False
    raise error(status)


def cuda_error(call: str, error: BaseException) -> CollectivesError:
    """A :class:`CollectivesError` for a CUDA error met while waiting on NCCL's stream.

    Example:
        >>> str(cuda_error("all_reduce", RuntimeError("cudaErrorIllegalAddress: ...")))
        'all_reduce: CUDA failed on the collectives stream: cudaErrorIllegalAddress: ...'
    """
    return CollectivesError(f"{call}: CUDA failed on the collectives stream: {error}")


def nccl_error(call: str, error: BaseException) -> CollectivesError:
    """A :class:`CollectivesError` for what a ``cupy.cuda.nccl`` call raised.

    CuPy raises ``NcclError`` (a ``RuntimeError`` with ``status``) for codes it names, and
    ``KeyError(code)`` for the codes it does not (7 ``ncclInProgress``, 8 ``ncclTimeout``).

    Example:
        >>> str(nccl_error("all_reduce", KeyError(8)))
        'all_reduce: NCCL failed with ncclTimeout (code 8)'
    """
    if isinstance(error, CollectivesError):
        return error
    if isinstance(error, KeyError) and len(error.args) == 1 and isinstance(error.args[0], int):
        code = error.args[0]
        return CollectivesError(
            f"{call}: NCCL failed with {NCCL_RESULT.get(code, 'an unknown result')} (code {code})"
        )
    status = getattr(error, "status", None)
    if isinstance(status, int):
        name = NCCL_RESULT.get(status, "an unknown result")
        return CollectivesError(f"{call}: NCCL failed with {name} (code {status}): {error}")
    return CollectivesError(f"{call}: NCCL call failed: {type(error).__name__}: {error}")
