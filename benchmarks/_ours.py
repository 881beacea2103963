"""Our side of the benchmark: each collective through a ``collectives`` communicator."""

from __future__ import annotations

from typing import Any, Callable

from collectives import as_bfloat16

from ._case import Case
from ._data import is_bfloat16

#: (the call to time, what to check after it): built once per case, called many times
Built = tuple[Callable[[], Any], Callable[[], Any]]


class Ours:
    """Runs a :class:`Case` through the collectives API, in place or out of place;
    ``async_op``: each call as ``f(..., async_op=True).wait()``.

    Example:
        >>> call, result = Ours(comm).build(case)
        >>> call(); count_wrong(result(), case.expected())
    """

    name = "ours"

    def __init__(self, comm: Any, async_op: bool = False):
        self.comm = comm
        self.async_op = async_op

    def build(self, case: Case) -> Built | None:
        """The call and its result getter (the getter returns None where nothing is checked:
        non-roots of reduce and gather)."""
        c, op, root, s, r, b = self.comm, case.redop, case.root, case.send, case.recv, case.buf
        a = self.async_op
        # bfloat16 buffers are uint16 bits: the calls get them wrapped, the checks read the bits
        w = as_bfloat16 if is_bfloat16(case.dtype) else _same
        S, R, B = (None if x is None else w(x) for x in (s, r, b))
        # bound methods up front so that the timed loop pays what a user's loop pays; each
        # async form is its own lambda (chosen here, once) for the same reason
        if case.op == "all_reduce":
            f = c.all_reduce
            if case.inplace:
                if a:
                    return (lambda: f(B, op, async_op=True).wait()), lambda: b
                return (lambda: f(B, op)), lambda: b
            if a:
                return (lambda: f(S, op, out=R, async_op=True).wait()), lambda: r
            return (lambda: f(S, op, out=R)), lambda: r
        if case.op == "reduce":
            f = c.reduce
            mine = (lambda: b if case.inplace else r) if case.is_root else (lambda: None)
            if case.inplace:
                if a:
                    return (lambda: f(B, root, op, async_op=True).wait()), mine
                return (lambda: f(B, root, op)), mine
            if a:
                return (lambda: f(S, root, op, out=R, async_op=True).wait()), mine
            return (lambda: f(S, root, op, out=R)), mine
        if case.op == "broadcast":
            f = c.broadcast
            if case.inplace:
                if a:
                    return (lambda: f(B, root, async_op=True).wait()), lambda: b
                return (lambda: f(B, root)), lambda: b
            # out of place, as nccl-tests' ncclBroadcast(send, recv): the root's send buffer
            # is read (its x is only read by the API), the others' receive buffers written
            X, x = (S, s) if case.is_root else (R, r)
            if a:
                return (lambda: f(X, root, async_op=True).wait()), lambda: x
            return (lambda: f(X, root)), lambda: x
        if case.op == "all_gather":
            f = c.all_gather
            if case.inplace:
                own = b[case.rank]
                OWN = w(own)
                if a:
                    return (lambda: f(OWN, out=B, async_op=True).wait()), lambda: b
                return (lambda: f(OWN, out=B)), lambda: b
            if a:
                return (lambda: f(S, out=R, async_op=True).wait()), lambda: r
            return (lambda: f(S, out=R)), lambda: r
        if case.op == "reduce_scatter":
            f = c.reduce_scatter
            if case.inplace:
                own = b[case.rank]
                OWN = w(own)
                if a:
                    return (lambda: f(B, op, out=OWN, async_op=True).wait()), lambda: own
                return (lambda: f(B, op, out=OWN)), lambda: own
            if a:
                return (lambda: f(S, op, out=R, async_op=True).wait()), lambda: r
            return (lambda: f(S, op, out=R)), lambda: r
        if case.op == "all_to_all":
            f = c.all_to_all
            if case.inplace:
                if a:
                    return (lambda: f(B, out=B, async_op=True).wait()), lambda: b
                return (lambda: f(B, out=B)), lambda: b
            if a:
                return (lambda: f(S, out=R, async_op=True).wait()), lambda: r
            return (lambda: f(S, out=R)), lambda: r
        if case.op == "gather":
            f = c.gather
            if not case.is_root:
                x = b if case.inplace else s
                X = w(x)
                if a:
                    return (lambda: f(X, root, async_op=True).wait()), lambda: None
                return (lambda: f(X, root)), lambda: None
            if case.inplace:
                own = b[case.rank]
                OWN = w(own)
                if a:
                    return (lambda: f(OWN, root, out=B, async_op=True).wait()), lambda: b
                return (lambda: f(OWN, root, out=B)), lambda: b
            if a:
                return (lambda: f(S, root, out=R, async_op=True).wait()), lambda: r
            return (lambda: f(S, root, out=R)), lambda: r
        if case.op == "scatter":
            f = c.scatter
            if case.inplace and case.is_root:
                own = b[case.rank]
                OWN = w(own)
                if a:
                    return (lambda: f(B, root, out=OWN, async_op=True).wait()), lambda: own
                return (lambda: f(B, root, out=OWN)), lambda: own
            if case.inplace:
                if a:
                    return (lambda: f(None, root, out=B, async_op=True).wait()), lambda: b
                return (lambda: f(None, root, out=B)), lambda: b
            if a:
                return (lambda: f(S, root, out=R, async_op=True).wait()), lambda: r
            return (lambda: f(S, root, out=R)), lambda: r
        if case.op == "hypercube":
            out = b if case.inplace else r
            return _hypercube(c, out, None if case.inplace else s, case.rank, w), lambda: out
        if case.op == "sendrecv":
            nxt, prv = (case.rank + 1) % case.size, (case.rank - 1) % case.size
            if not case.inplace:
                f = c.sendrecv
                if a:
                    return (lambda: f(S, nxt, out=R, source=prv, async_op=True).wait()), (lambda: r)
                return (lambda: f(S, nxt, out=R, source=prv)), lambda: r
            # in place, nccl-tests sends one buffer and receives into it at once (timed,
            # never checked: N/A in its #wrong column). A receive into memory being sent is
            # undefined, and refused here (inside comm.group()): the same send and a receive
            # into a spare buffer of its size are timed instead.
            group, send, recv, spare = c.group, c.send, c.recv, w(b.copy())

            def sendrecv() -> None:
                with group():
                    send(B, nxt)
                    recv(spare, prv)

            def sendrecv_async() -> None:
                with group():
                    sent = send(B, nxt, async_op=True)
                    received = recv(spare, prv, async_op=True)
                sent.wait()
                received.wait()

            return sendrecv_async if a else sendrecv, lambda: None
        return None

    def close(self) -> None:
        self.comm.close()


def _hypercube(comm: Any, out: Any, mine: Any, rank: int, wrap: Callable) -> Callable[[], None]:
    """nccl-tests' hypercube all_gather into ``out`` (size, count): at step ``mask``, the
    ``mask`` blocks this rank holds are swapped with those of rank ``rank ^ mask``."""
    group, send, recv, size = comm.group, comm.send, comm.recv, comm.size

    def hypercube() -> None:
        if mine is not None:
            out[rank] = mine
        mask = 1
        while mask < size:
            held = rank & ~(mask - 1)
            theirs = held ^ mask
            with group():
                send(wrap(out[held : held + mask]), rank ^ mask)
                recv(wrap(out[theirs : theirs + mask]), rank ^ mask)
            mask <<= 1

    return hypercube


def _same(x: Any) -> Any:
    return x
