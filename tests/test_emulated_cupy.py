"""The emulated CuPy of tests/emulation does what CuPy and NCCL do where the tests rely on
it: refusals, per-thread devices, stream order, NCCL's errors and faults. Each check runs in a
process of its own (the emulation never enters this one)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.emulated_gpu import nccl_job_env, real_cupy
from tests.spmd_launcher import REPO

pytestmark = pytest.mark.skipif(real_cupy() is not None, reason="a real CuPy is installed")


def run(script: str, devices: int = 2, **env: str) -> str:
    """``script`` in a fresh Python on the emulated CuPy; its stdout (it must exit 0)."""
    environ = {**nccl_job_env(gpus=devices), **env}
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)],
        cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**__import__("os").environ, **environ},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


def test_cupys_refusals():
    out = run("""
        import numpy as np, cupy
        x = cupy.arange(4, dtype=cupy.float32)
        for what in (lambda: np.asarray(x), lambda: x + np.ones(4), lambda: np.testing.assert_array_equal(x, 0)):
            try:
                what()
            except TypeError as e:
                print("refused:", e)
        print(x.get().tolist(), type(x).__module__, float(x.sum()))
    """)
    assert out.count("refused:") == 3, out
    assert "Implicit conversion to a NumPy array is not allowed" in out
    assert "Unsupported type <class 'numpy.ndarray'>" in out
    assert "[0.0, 1.0, 2.0, 3.0] cupy 6.0" in out


def test_fresh_memory_is_not_zero_and_pointers_resolve_to_their_device():
    out = run("""
        import cupy
        from cupy.cuda import _gpu
        a = cupy.empty(8, cupy.uint8)
        with cupy.cuda.Device(1):
            b = cupy.zeros(3)
        print(int((a != 0).all()), b.device.id, _gpu.find(b[1:].data.ptr)[0].device)
    """)
    assert out.split() == ["1", "1", "1"], out


def test_the_current_device_is_per_thread_and_starts_at_0():
    out = run("""
        import threading, cupy
        cupy.cuda.Device(1).use()
        seen = []
        t = threading.Thread(target=lambda: seen.append(cupy.ones(1).device.id))
        t.start(); t.join()
        with cupy.cuda.Device(0):
            a = cupy.ones(2)
        try:
            a + 1  # current device 1, array on 0
        except ValueError as e:
            print("refused:", e)
        print(cupy.ones(1).device.id, seen)
    """)
    assert (
        "Array device must be same as the current device: array device = 0 while current = 1" in out
    )
    assert out.strip().endswith("1 [0]"), out


def test_a_launch_delay_shows_a_missing_stream_wait():
    script = """
        import cupy
        from cupy.cuda import nccl
        comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
        side = cupy.cuda.Stream(non_blocking=True)
        x, out = cupy.full(4, 3.0, cupy.float32), cupy.zeros(4, cupy.float32)
        comm.allReduce(x.data.ptr, out.data.ptr, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, side.ptr)
        early = out.get().tolist()  # no wait on side: may run before the all-reduce
        cupy.cuda.get_current_stream().wait_event(side.record())
        print(early, out.get().tolist())
    """
    assert (
        run(script, EMULATED_CUPY_DELAY="0.3").strip()
        == "[0.0, 0.0, 0.0, 0.0] [3.0, 3.0, 3.0, 3.0]"
    )


def test_ncclerror_as_cupy_builds_it_and_a_bad_pointer_faults_the_device():
    out = run("""
        import numpy as np, cupy
        from cupy.cuda import nccl
        comm = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
        x = cupy.ones(4, cupy.float32)
        for bad in (dict(datatype=12), dict(op=7)):
            args = dict(datatype=nccl.NCCL_FLOAT32, op=nccl.NCCL_SUM) | bad
            try:
                comm.allReduce(x.data.ptr, x.data.ptr, 4, args["datatype"], args["op"], 0)
            except nccl.NcclError as e:
                print(e.status, e)
        try:
            nccl.NcclError(7)
        except KeyError as e:
            print("KeyError", e)
        host = np.ones(4, np.float32)
        comm.allReduce(host.ctypes.data, x.data.ptr, 4, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, 0)
        try:
            cupy.cuda.Stream.null.synchronize()
        except cupy.cuda.runtime.CUDARuntimeError as e:
            print(e.status)
        comm.destroy()
        try:
            comm.size()
        except nccl.NcclError as e:
            print("destroyed:", e.status)
    """)
    lines = out.splitlines()
    assert lines[0].startswith("4 NCCL_ERROR_INVALID_ARGUMENT: invalid argument"), out
    assert lines[1].startswith("4 "), out
    assert lines[2] == "KeyError 7", out
    assert lines[3] == "700", out  # cudaErrorIllegalAddress, sticky
    assert lines[4] == "destroyed: 4", out


def test_integer_avg_divides_toward_zero_down_to_the_types_most_negative_value():
    # NCCL's SumPostDiv is C's division (toward zero); the type's most negative value has no
    # positive counterpart, so a division through abs() would wrap (int8: -128 / 2 gave +64)
    out = run(
        """
        import numpy as np
        from cupy.cuda.nccl import _int_divide
        for dtype in (np.int8, np.int32, np.int64, np.uint8):
            info = np.iinfo(dtype)
            values = np.array([info.min, info.min + 1, 0, 1, 7, info.max], dtype)
            for n in (1, 2, 3, 4):
                want = [int(v) // n if v >= 0 else -(-int(v) // n) for v in values.tolist()]
                assert _int_divide(values, n).tolist() == want, (dtype, n)
        print("divided")
        """
    )
    assert "divided" in out
