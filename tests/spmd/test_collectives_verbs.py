"""Every verb x dtype x op against NumPy references: in place and out of place, sync and async.

The arrays passed are of the backend under test (``xp``: NumPy, or CuPy under
COLLECTIVES_TEST_BACKEND=mpi-cupy and nccl); references are computed on the host.

Each rank's input is a deterministic function of (rank, index), so every rank can compute
every other rank's input and the reference result. Values are small integers (and products
of 1s and 2s), exact in every dtype including float16 and bfloat16; only AVG of floating
types can round, and it is compared with a tolerance of the dtype's precision.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np

import collectives as col

SHARED_COMM = True  # COLLECTIVES_TEST_REUSE_COMM=1 may give every test one communicator

WORLD_SIZES = (1, 2, 3, 4)
SPMD_TIMEOUT = 300

DTYPES = (
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
    "bfloat16",
)
REAL_OPS = ("sum", "prod", "max", "min", "avg")
COMPLEX_OPS = ("sum", "avg")
# sync: the call returns the result; the others pass async_op=True and finish the Work
# through wait(), synchronize(), or polling is_completed() and reading .result.
MODES = ("sync", "wait", "synchronize", "poll")
# (shape, mode): every mode on a 2-D array, then empty, 0-d and 3-D arrays.
CASES = [((2, 3), mode) for mode in MODES] + [((0,), "sync"), ((), "wait"), ((3, 1, 2), "poll")]
# On NCCL, Work.wait() orders the caller's current stream after the call without blocking the
# host, so the call is complete only once the stream has run: is_completed() is checked after
# synchronize() there.
STREAM_ORDERED = os.environ.get("COLLECTIVES_TEST_BACKEND") == "nccl"
# Relative tolerance of AVG for floating dtypes (division by 3 rounds).
AVG_RTOL = {"float16": 1e-3, "bfloat16": 8e-3, "float32": 1e-6, "complex64": 1e-6}


def ops_for(name: str) -> tuple[str, ...]:
    return COMPLEX_OPS if name.startswith("complex") else REAL_OPS


def is_int(name: str) -> bool:
    return "int" in name


def values(name: str, shape: tuple, rank: int, op: str = "sum") -> np.ndarray:
    """The logical values rank ``rank`` holds (float64 or complex128): small exact integers."""
    idx = np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape)
    signed = not name.startswith("uint")
    if op == "prod":  # 1s and 2s (and signs): a product over 4 ranks stays within int8
        v = 1 + (rank + idx) % 2
        if signed:
            v = np.where((rank + 2 * idx) % 3 == 0, -v, v)
    else:  # distinct per rank at index 0, so misplaced data shows
        v = (rank * 5 + idx * 3) % 11 - (5 if signed else 0)
    v = v.astype(np.float64)
    if name.startswith("complex"):
        v = v + 1j * ((rank * 3 + idx * 5) % 7 - 3)
    return v


def encode(v: np.ndarray, name: str) -> np.ndarray:
    """Logical values -> the storage array a rank passes (uint16 bits for bfloat16)."""
    v = np.asarray(v)  # a 0-d slice of the stack is a NumPy scalar, not an array
    if name == "bfloat16":
        bits = v.astype(np.float32).view(np.uint32)
        assert not np.any(bits & 0xFFFF), "test values must be exact in bfloat16"
        return np.asarray(bits >> 16).astype(np.uint16)
    return v.astype(name)


def host(a) -> np.ndarray:
    """A NumPy copy of a NumPy or CuPy array."""
    return a.get() if hasattr(a, "get") else np.asarray(a)


def decode(a, name: str) -> np.ndarray:
    a = host(a)
    if name == "bfloat16":
        assert a.dtype == np.uint16
        return (a.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    assert a.dtype == np.dtype(name), f"result has dtype {a.dtype}, expected {name}"
    return a.astype(np.complex128 if name.startswith("complex") else np.float64)


def wrap(a: np.ndarray, name: str):
    return col.as_bfloat16(a) if name == "bfloat16" else a


def reference(stack: np.ndarray, op: str, name: str) -> np.ndarray:
    """The reduction over axis 0 (the ranks); integer AVG truncates toward zero (as NCCL)."""
    if op == "sum":
        return stack.sum(0)
    if op == "prod":
        return stack.prod(0)
    if op == "max":
        return stack.max(0)
    if op == "min":
        return stack.min(0)
    mean = stack.sum(0) / stack.shape[0]
    return np.trunc(mean) if is_int(name) else mean


def check(actual, expected: np.ndarray, name: str, op: str, what: str) -> None:
    assert actual.shape == expected.shape, (
        f"{what}: shape {actual.shape}, expected {expected.shape}"
    )
    got = decode(actual, name)
    if op == "avg" and not is_int(name):
        rtol = AVG_RTOL.get(name, 1e-12)
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=0, err_msg=what)
    else:
        np.testing.assert_array_equal(got, expected, err_msg=what)


def finish(ret, mode: str, what: str):
    """The call's result: returned directly (sync) or through the Work (async)."""
    if mode == "sync":
        assert not isinstance(ret, col.Work), what
        return ret
    assert isinstance(ret, col.Work), f"{what}: async_op=True returned {type(ret).__name__}"
    if mode == "wait":
        result = ret.wait()
        if STREAM_ORDERED:  # wait() ordered the caller's stream after the call, not the host
            assert ret.synchronize() is result, what
    elif mode == "synchronize":
        result = ret.synchronize()
    else:
        deadline = time.monotonic() + 20
        while not ret.is_completed():
            assert time.monotonic() < deadline, f"{what}: is_completed() never became true"
            time.sleep(0)
        result = ret.result
        assert ret.wait() is result
    assert ret.is_completed(), what
    assert ret.result is result, what
    return result


class Cases:
    """Runs many sub-cases in one test item and reports every failing one, not just the first.

    The sub-cases here fail (if at all) identically on every rank, so all ranks stay in step.
    """

    def __init__(self) -> None:
        self.failed: list[str] = []

    @contextmanager
    def case(self, what: str) -> Iterator[None]:
        try:
            yield
        except Exception as e:  # AssertionError or an error from the library
            self.failed.append(f"{what}: {type(e).__name__}: {str(e).strip()[:400]}")

    def check(self) -> None:
        if self.failed:
            shown = "\n".join(self.failed[:15])
            raise AssertionError(f"{len(self.failed)} sub-cases failed, first ones:\n{shown}")


def op_arg(op: str, i: int):
    """Alternate between the string and the enum spellings (and upper case) of an op."""
    return (op, col.ReduceOp[op.upper()], op.upper())[i % 3]


def reduction_cases():
    for name in DTYPES:
        for op in ops_for(name):
            for shape, mode in CASES:
                yield name, op, shape, mode


def test_all_reduce(comm, xp):
    cases = Cases()
    size, rank = comm.size, comm.rank
    for i, (name, op, shape, mode) in enumerate(reduction_cases()):
        what = f"all_reduce {name} op={op} shape={shape} {mode}"
        with cases.case(what):
            stack = np.stack([values(name, shape, r, op) for r in range(size)])
            expected = reference(stack, op, name)
            mine = xp.asarray(encode(stack[rank], name))
            asynchronous = mode != "sync"

            x = mine.copy()
            got = finish(
                comm.all_reduce(wrap(x, name), op_arg(op, i), async_op=asynchronous), mode, what
            )
            assert got is x, f"{what}: in place returns x"
            check(x, expected, name, op, what + " in place")

            x, out = mine.copy(), xp.zeros_like(mine)
            ret = comm.all_reduce(
                wrap(x, name), op_arg(op, i + 1), out=wrap(out, name), async_op=asynchronous
            )
            assert finish(ret, mode, what) is out
            check(out, expected, name, op, what + " out of place")
            np.testing.assert_array_equal(host(x), host(mine), err_msg=what + ": x changed")
    cases.check()


def test_integer_avg_truncates_toward_zero_at_the_extremes(comm, xp):
    # Rank 0 holds the values and the others zeros: each average is the value divided by the
    # size, toward zero as C's division (and NCCL's ncclAvg on integers), up to the dtype's
    # extremes, whose sum over the ranks still fits. The most negative value is the MPI
    # backend's own division's case (NCCL divides in its kernel).
    size, rank = comm.size, comm.rank
    for name in ("int8", "int32", "int64", "uint8", "uint32", "uint64"):
        info = np.iinfo(name)
        given = [0, 1, 5, 7, 8, int(info.max)]
        if info.min < 0:
            given += [-1, -5, -7, -8] + ([int(info.min)] if comm.backend == "mpi" else [])
        quotients = [abs(v) // size if v >= 0 else -(abs(v) // size) for v in given]
        expected = np.array(quotients, name)
        mine = np.array(given, name) if rank == 0 else np.zeros(len(given), name)
        for asynchronous in (False, True):
            what = f"avg of {name} over {size} ranks, async_op={asynchronous}"
            x = xp.asarray(mine)
            out = xp.zeros_like(x)
            done = comm.all_reduce(x, "avg", out=out, async_op=asynchronous)
            if asynchronous:
                done.wait()
            np.testing.assert_array_equal(host(out), expected, err_msg=what)
            done = comm.all_reduce(x, "avg", async_op=asynchronous)
            if asynchronous:
                done.wait()
            np.testing.assert_array_equal(host(x), expected, err_msg=what + ", in place")


def test_reduce(comm, xp):
    cases = Cases()
    size, rank = comm.size, comm.rank
    for i, (name, op, shape, mode) in enumerate(reduction_cases()):
        root = size - 1 if i % 4 else 0
        what = f"reduce {name} op={op} shape={shape} {mode} root={root}"
        with cases.case(what):
            stack = np.stack([values(name, shape, r, op) for r in range(size)])
            expected = reference(stack, op, name)
            mine = xp.asarray(encode(stack[rank], name))
            asynchronous = mode != "sync"

            x = mine.copy()
            ret = comm.reduce(wrap(x, name), root, op_arg(op, i), async_op=asynchronous)
            got = finish(ret, mode, what)
            if rank == root:
                assert got is x
                check(x, expected, name, op, what + " in place")

            x, out = mine.copy(), xp.zeros_like(mine)
            ret = comm.reduce(
                wrap(x, name), root=root, op=op, out=wrap(out, name), async_op=asynchronous
            )
            got = finish(ret, mode, what)
            np.testing.assert_array_equal(host(x), host(mine), err_msg=what + ": x changed")
            if rank == root:
                assert got is out
                check(out, expected, name, op, what + " out of place")
    cases.check()


def test_reduce_of_buffers_large_enough_to_be_made_as_all_reduce(comm, xp):
    # from 256 KiB, MPICH's reduce (and Intel MPI's and, from 1 MiB, Open MPI's non-blocking
    # one) is made as an all_reduce whose result only the root keeps: buffers of either side
    # of those sizes, each root, in place and not, float16's average on float32 copies
    size, rank = comm.size, comm.rank
    for nbytes, dtype, op in (
        ((256 << 10) - 4, np.float32, "sum"),
        (256 << 10, np.float32, "sum"),
        (1 << 20, np.float32, "avg"),
        (1 << 20, np.float16, "avg"),
        (1 << 20, np.int32, "max"),
    ):
        count = nbytes // np.dtype(dtype).itemsize
        stack = np.stack([(np.arange(count) % 7 + 2 * r).astype(dtype) for r in range(size)])
        expected = reference(stack, op, np.dtype(dtype).name)
        for root in sorted({0, size - 1}):
            for mode in ("sync", "wait"):
                what = f"reduce of {nbytes} B of {np.dtype(dtype).name}, {op}, root {root}, {mode}"
                async_op = mode != "sync"
                x = xp.array(stack[rank])
                out = xp.zeros_like(x)
                got = finish(comm.reduce(x, root, op, out=out, async_op=async_op), mode, what)
                np.testing.assert_array_equal(host(x), stack[rank], err_msg=what + ": x changed")
                if rank == root:
                    assert got is out
                    np.testing.assert_array_equal(host(out), expected, err_msg=what)
                else:
                    assert not host(out).any(), what + ": out written off the root"
                got = finish(comm.reduce(x, root, op, async_op=async_op), mode, what)
                if rank == root:
                    assert got is x
                    np.testing.assert_array_equal(host(x), expected, err_msg=what + " in place")
                else:
                    np.testing.assert_array_equal(host(x), stack[rank], err_msg=what + " in place")
        # two in flight at once, in place: each its own scratch buffer off the root
        first, second = xp.array(stack[rank]), xp.array(stack[rank])
        works = [comm.reduce(a, 0, op, async_op=True) for a in (first, second)]
        for a, work in zip((first, second), works):
            assert work.wait() is a
            np.testing.assert_array_equal(
                host(a), expected if rank == 0 else stack[rank], err_msg=f"{nbytes} B, two at once"
            )


def test_broadcast(comm, xp):
    cases = Cases()
    size, rank = comm.size, comm.rank
    for i, name in enumerate(DTYPES):
        for shape, mode in CASES:
            root = size - 1 if i % 3 else 0
            what = f"broadcast {name} shape={shape} {mode} root={root}"
            with cases.case(what):
                expected = values(name, shape, root)
                x = xp.asarray(encode(values(name, shape, rank), name))
                ret = comm.broadcast(wrap(x, name), root, async_op=mode != "sync")
                assert finish(ret, mode, what) is x
                check(x, expected, name, "sum", what)
    cases.check()


def test_all_gather(comm, xp):
    cases = Cases()
    size, rank = comm.size, comm.rank
    for name in DTYPES:
        for shape, mode in CASES:
            what = f"all_gather {name} shape={shape} {mode}"
            with cases.case(what):
                stack = np.stack([values(name, shape, r) for r in range(size)])
                mine = xp.asarray(encode(stack[rank], name))
                asynchronous = mode != "sync"

                got = finish(
                    comm.all_gather(wrap(mine.copy(), name), async_op=asynchronous), mode, what
                )
                check(got, stack, name, "sum", what + " new out")

                out = xp.zeros((size, *shape), mine.dtype)
                ret = comm.all_gather(wrap(mine, name), out=wrap(out, name), async_op=asynchronous)
                assert finish(ret, mode, what) is out
                check(out, stack, name, "sum", what + " out given")

                out = xp.zeros((size, *shape), mine.dtype)
                out[rank] = mine
                ret = comm.all_gather(
                    wrap(out[rank, ...], name), out=wrap(out, name), async_op=asynchronous
                )
                assert finish(ret, mode, what) is out
                check(out, stack, name, "sum", what + " in place (x = out[rank])")
    cases.check()


def test_in_place_forms_told_apart_from_new_arrays_made_where_old_views_were(comm, xp):
    # a view that is gone and a new array that takes its id must never be taken for each
    # other (as a cache of addresses by id would, without a weak reference to tell them apart)
    size, rank = comm.size, comm.rank
    stack = np.stack([np.full(3, r + 1, np.float32) for r in range(size)])
    for i in range(40):
        out = xp.zeros((size, 3), xp.float32)
        out[rank] = xp.asarray(stack[rank])
        assert comm.all_gather(out[rank], out=out) is out  # a view made for this call
        np.testing.assert_array_equal(host(out), stack, err_msg=f"in place, round {i}")
        mine = xp.asarray(stack[rank]) * 1  # a new array, perhaps where the view was
        fresh = xp.zeros((size, 3), xp.float32)
        assert comm.all_gather(mine, out=fresh) is fresh
        np.testing.assert_array_equal(host(fresh), stack, err_msg=f"out of place, round {i}")
        np.testing.assert_array_equal(host(mine), stack[rank], err_msg=f"x, round {i}")


def test_reduce_scatter(comm, xp):
    cases = Cases()
    size, rank = comm.size, comm.rank
    for i, (name, op, shape, mode) in enumerate(reduction_cases()):
        what = f"reduce_scatter {name} op={op} shape={shape} {mode}"
        with cases.case(what):
            full = (size, *shape)
            stack = np.stack([values(name, full, r, op) for r in range(size)])
            expected = reference(stack, op, name)[rank]
            mine = xp.asarray(encode(stack[rank], name))
            asynchronous = mode != "sync"

            x = mine.copy()
            got = finish(
                comm.reduce_scatter(wrap(x, name), op_arg(op, i), async_op=asynchronous), mode, what
            )
            check(got, expected, name, op, what + " new out")

            x, out = mine.copy(), xp.zeros(shape, mine.dtype)
            ret = comm.reduce_scatter(wrap(x, name), op, out=wrap(out, name), async_op=asynchronous)
            assert finish(ret, mode, what) is out
            check(out, expected, name, op, what + " out given")
            np.testing.assert_array_equal(host(x), host(mine), err_msg=what + ": x changed")

            x = mine.copy()
            ret = comm.reduce_scatter(
                wrap(x, name), op, out=wrap(x[rank, ...], name), async_op=asynchronous
            )
            finish(ret, mode, what)
            check(x[rank, ...], expected, name, op, what + " in place (out = x[rank])")
            others = [r for r in range(size) if r != rank]
            np.testing.assert_array_equal(
                host(x[others]), host(mine[others]), err_msg=what + " in place: x[r != rank]"
            )
    cases.check()


def test_reduce_scatter_of_slots_large_enough_to_be_given_counts(comm, xp):
    # from 64 KiB a rank, MPICH's non-blocking and Open MPI's blocking calls are made with
    # each rank's count (MPI_(I)reduce_scatter); below, and elsewhere, without: float32
    # slots of either side of that size
    counted_from = 64 << 10
    size, rank = comm.size, comm.rank
    for count in (counted_from // 4 - 1, counted_from // 4):
        stack = np.stack([np.arange(size * count, dtype=np.float32) % 7 + r for r in range(size)])
        stack = stack.reshape(size, size, count)
        expected = stack.sum(axis=0)[rank]
        for mode in ("sync", "wait"):
            what = f"reduce_scatter of {count} float32 a rank, {mode}"
            async_op = mode != "sync"
            x = xp.array(stack[rank])  # a copy: the in-place call writes it
            out = xp.zeros(count, xp.float32)
            assert finish(comm.reduce_scatter(x, out=out, async_op=async_op), mode, what) is out
            np.testing.assert_array_equal(host(out), expected, err_msg=what)
            finish(comm.reduce_scatter(x, out=x[rank], async_op=async_op), mode, what)
            np.testing.assert_array_equal(host(x[rank]), expected, err_msg=what + " in place")
            others = [r for r in range(size) if r != rank]
            np.testing.assert_array_equal(host(x[others]), stack[rank][others], err_msg=what)


def test_all_to_all(comm, xp):
    cases = Cases()
    size, rank = comm.size, comm.rank
    for name in DTYPES:
        for shape, mode in CASES:
            what = f"all_to_all {name} shape={shape} {mode}"
            with cases.case(what):
                full = (size, *shape)
                stack = np.stack([values(name, full, r) for r in range(size)])
                expected = stack[:, rank]  # out[j] is x[rank] of rank j
                mine = xp.asarray(encode(stack[rank], name))
                asynchronous = mode != "sync"

                got = finish(
                    comm.all_to_all(wrap(mine.copy(), name), async_op=asynchronous), mode, what
                )
                check(got, expected, name, "sum", what + " new out")

                x, out = mine.copy(), xp.zeros_like(mine)
                ret = comm.all_to_all(wrap(x, name), out=wrap(out, name), async_op=asynchronous)
                assert finish(ret, mode, what) is out
                check(out, expected, name, "sum", what + " out given")
                np.testing.assert_array_equal(host(x), host(mine), err_msg=what + ": x changed")

                x = mine.copy()
                ret = comm.all_to_all(wrap(x, name), out=wrap(x, name), async_op=asynchronous)
                finish(ret, mode, what)
                check(x, expected, name, "sum", what + " in place (out = x)")
    cases.check()


def test_gather(comm, xp):
    cases = Cases()
    size, rank = comm.size, comm.rank
    for i, name in enumerate(DTYPES):
        for shape, mode in CASES:
            root = size - 1 if i % 3 else 0
            what = f"gather {name} shape={shape} {mode} root={root}"
            with cases.case(what):
                stack = np.stack([values(name, shape, r) for r in range(size)])
                mine = xp.asarray(encode(stack[rank], name))
                asynchronous = mode != "sync"

                got = finish(comm.gather(wrap(mine, name), root, async_op=asynchronous), mode, what)
                if rank == root:
                    check(got, stack, name, "sum", what + " new out")
                else:
                    assert got is None, f"{what}: returned {got!r} off root"

                out = xp.zeros((size, *shape), mine.dtype) if rank == root else None
                ret = comm.gather(
                    wrap(mine, name),
                    root=root,
                    out=out if out is None else wrap(out, name),
                    async_op=asynchronous,
                )
                got = finish(ret, mode, what)
                if rank == root:
                    assert got is out
                    check(out, stack, name, "sum", what + " out given")

                if rank == root:
                    out = xp.zeros((size, *shape), mine.dtype)
                    out[root] = mine
                    x = out[root, ...]  # a view even when out is 1-D
                else:
                    out, x = None, mine
                ret = comm.gather(
                    wrap(x, name),
                    root,
                    out=out if out is None else wrap(out, name),
                    async_op=asynchronous,
                )
                finish(ret, mode, what)
                if rank == root:
                    check(out, stack, name, "sum", what + " in place (x = out[root])")
    cases.check()


def test_scatter(comm, xp):
    cases = Cases()
    size, rank = comm.size, comm.rank
    for i, name in enumerate(DTYPES):
        for shape, mode in CASES:
            root = size - 1 if i % 3 else 0
            what = f"scatter {name} shape={shape} {mode} root={root}"
            with cases.case(what):
                full = (size, *shape)
                source = values(name, full, root)
                expected = source[rank]
                # Off root, x only supplies the shape and dtype: give it different contents.
                x = xp.asarray(
                    encode(source if rank == root else values(name, full, rank + 1), name)
                )
                asynchronous = mode != "sync"

                got = finish(comm.scatter(wrap(x, name), root, async_op=asynchronous), mode, what)
                check(got, expected, name, "sum", what + " new out")

                out = xp.zeros(shape, x.dtype)
                send = wrap(x, name) if rank == root else None
                ret = comm.scatter(send, root=root, out=wrap(out, name), async_op=asynchronous)
                assert finish(ret, mode, what) is out
                check(out, expected, name, "sum", what + " out given")

                if rank == root:
                    x = x.copy()
                    ret = comm.scatter(
                        wrap(x, name), root, out=wrap(x[root, ...], name), async_op=asynchronous
                    )
                    finish(ret, mode, what)
                    check(x[root, ...], expected, name, "sum", what + " in place (out = x[root])")
                    check(x, source, name, "sum", what + " in place leaves x")
                else:
                    out = xp.zeros(shape, x.dtype)
                    ret = comm.scatter(out=wrap(out, name), root=root, async_op=asynchronous)
                    finish(ret, mode, what)
                    check(out, expected, name, "sum", what + " out only")
    cases.check()


def test_send_recv_ring_in_group(comm, xp):
    cases = Cases()
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    for name in DTYPES:
        for shape, mode in CASES:
            what = f"send/recv ring {name} shape={shape} {mode}"
            with cases.case(what):
                mine = xp.asarray(encode(values(name, shape, rank), name))
                got = xp.zeros_like(mine)
                asynchronous = mode != "sync"
                with comm.group():
                    sent = comm.send(wrap(mine, name), right, async_op=asynchronous)
                    received = comm.recv(wrap(got, name), left, async_op=asynchronous)
                if asynchronous:
                    assert finish(sent, mode, what) is None
                    assert finish(received, mode, what) is got
                else:
                    assert sent is None and received is got
                check(got, values(name, shape, left), name, "sum", what)
    cases.check()


def test_send_recv_pairs_without_group(comm, xp):
    """Even ranks talk to the next odd rank with plain (unbatched) calls, both directions."""
    cases = Cases()
    size, rank = comm.size, comm.rank
    peer = rank + 1 if rank % 2 == 0 else rank - 1
    if peer >= size:
        return  # the last rank of an odd world sits out
    for name in DTYPES:
        for shape, mode in CASES:
            what = f"send/recv pair {name} shape={shape} {mode}"
            with cases.case(what):
                asynchronous = mode != "sync"
                mine = xp.asarray(encode(values(name, shape, rank), name))
                got = xp.zeros_like(mine)
                # Even ranks send first; odd ranks receive first: no deadlock with blocking calls.
                if rank % 2 == 0:
                    finish(comm.send(wrap(mine, name), peer, async_op=asynchronous), mode, what)
                    finish(comm.recv(wrap(got, name), peer, async_op=asynchronous), mode, what)
                else:
                    finish(comm.recv(wrap(got, name), peer, async_op=asynchronous), mode, what)
                    finish(comm.send(wrap(mine, name), peer, async_op=asynchronous), mode, what)
                check(got, values(name, shape, peer), name, "sum", what)
    cases.check()


def test_sendrecv_ring(comm, xp):
    """Each rank sends to the next and receives from the previous in one call, into ``out``
    or into an array the call makes."""
    cases = Cases()
    size, rank = comm.size, comm.rank
    right, left = (rank + 1) % size, (rank - 1) % size
    for name in DTYPES:
        for (shape, mode), given in zip(CASES, [True, False] * len(CASES)):
            what = f"sendrecv ring {name} shape={shape} {mode} out {'given' if given else 'made'}"
            with cases.case(what):
                mine = xp.asarray(encode(values(name, shape, rank), name))
                got = xp.zeros_like(mine)
                out = wrap(got, name) if given else None
                ret = comm.sendrecv(
                    wrap(mine, name), right, out=out, source=left, async_op=mode != "sync"
                )
                if mode != "sync":
                    ret = finish(ret, mode, what)
                if given:
                    assert ret is got, what
                else:
                    got = ret
                check(got, values(name, shape, left), name, "sum", what)
                check(mine, values(name, shape, rank), name, "sum", what + " leaves x")
    cases.check()


def test_sendrecv_matches_a_send_and_a_recv_and_itself(comm, xp):
    """A sendrecv pairs with the peer's separate recv and send (in either order), and with
    this rank itself as peer and source."""
    size, rank = comm.size, comm.rank
    mine = xp.arange(6, dtype=np.float32) + 10 * rank
    np.testing.assert_array_equal(host(comm.sendrecv(mine, rank)), host(mine))
    peer = rank ^ 1
    if peer >= size:
        return
    for async_op in (False, True):
        if rank % 2 == 0:
            got = comm.sendrecv(mine, peer, async_op=async_op)
            got = got.wait() if async_op else got
        else:
            got = xp.zeros_like(mine)
            if async_op:
                sent = comm.send(mine, peer, async_op=True)
                comm.recv(got, peer)
                sent.wait()
            else:
                comm.recv(got, peer)
                comm.send(mine, peer)
        np.testing.assert_array_equal(host(got), host(mine) - 10 * rank + 10 * peer)


def test_async_calls_overlap(comm, xp):
    """Several async calls in flight at once, finished in reverse order."""
    size, rank = comm.size, comm.rank
    xs = [xp.full(5, rank + k, np.int64) for k in range(4)]
    works = [comm.all_reduce(x, async_op=True) for x in xs]
    gathered = comm.all_gather(xp.array([rank], np.int32), async_op=True)
    barrier = comm.barrier(async_op=True)
    assert barrier.synchronize() is None and barrier.is_completed()
    np.testing.assert_array_equal(host(gathered.wait()), np.arange(size)[:, None])
    for k, work in reversed(list(enumerate(works))):
        assert work.wait() is xs[k]
        np.testing.assert_array_equal(host(xs[k]), sum(r + k for r in range(size)))


def test_barrier(comm):
    for _ in range(3):
        assert comm.barrier() is None
    work = comm.barrier(async_op=True)
    assert isinstance(work, col.Work)
    assert work.wait() is None and work.is_completed()
