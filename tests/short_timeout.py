"""A communicator for a multi-rank test that makes a call time out, on any backend."""

from __future__ import annotations

import collectives as col


def init_with_short_timeout(backend: str, timeout: float, **kwargs) -> col.Communicator:
    """``col.init(backend, timeout=timeout, **kwargs)`` for a test that makes a call time out.

    On NCCL the first call between two ranks connects them lazily, and a rank whose peer
    never joins blocks inside NCCL's connect, where no timeout reaches it; with two ranks on
    one GPU the connect alone can outlast a short timeout. So there every rank first makes a
    collective and a ring of send/recv under a long timeout, and only then is
    ``comm.timeout`` shrunk (which the backend's watchdog follows too).
    """
    if backend != "nccl":
        return col.init(backend, timeout=timeout, **kwargs)
    import cupy

    comm = col.init(backend, timeout=max(timeout, 60.0), **kwargs)
    sent = cupy.ones(1024, cupy.float32)
    comm.all_reduce(sent)
    if comm.size > 1:
        received = cupy.empty_like(sent)
        with comm.group():
            comm.send(sent, (comm.rank + 1) % comm.size)
            comm.recv(received, (comm.rank - 1) % comm.size)
    comm.stream.synchronize()
    comm.timeout = timeout
    return comm


def warm_up_counts(comm: col.Communicator) -> tuple[int, int]:
    """(calls, collectives) that :func:`init_with_short_timeout` made on ``comm`` before
    handing it over: a test's expected call and collective numbers come after them."""
    if comm.backend != "nccl":
        return 0, 0
    return (3 if comm.size > 1 else 1), 1
