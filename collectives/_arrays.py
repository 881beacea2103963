"""What counts as an array, and the checks every call makes on its arguments."""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any

import numpy as np
from mpi4py import MPI

from ._dtypes import NAME_OF_CHAR, dtype_name
from ._errors import InvalidArgumentError


class BFloat16Array:
    """A uint16 array (NumPy or CuPy) whose bits are bfloat16 values.

    Example:
        >>> bits = np.array([0x3F80, 0x4020], np.uint16)   # 1.0 and 2.5 in bfloat16
        >>> comm.all_reduce(as_bfloat16(bits))             # reduced as bfloat16, in place
        array([16256, 16416], dtype=uint16)
    """

    __slots__ = ("array",)

    def __init__(self, array: Any):
        if not (isinstance(array, np.ndarray) or is_device_array(array)):
            raise InvalidArgumentError(
                f"as_bfloat16: array must be a NumPy or CuPy uint16 array, got {type(array).__name__}"
            )
        if array.dtype != np.uint16:
            raise InvalidArgumentError(
                f"as_bfloat16: array has dtype {array.dtype}, expected uint16"
            )
        self.array = array

    @property
    def shape(self) -> tuple[int, ...]:
        return self.array.shape

    def __repr__(self) -> str:
        return f"as_bfloat16({self.array!r})"


def as_bfloat16(array: Any) -> BFloat16Array:
    """Declare a uint16 array as holding bfloat16 values (CuPy has no bfloat16 dtype)."""
    return BFloat16Array(array)


def _cupy() -> Any:
    return sys.modules.get("cupy")


def is_device_array(x: Any) -> bool:
    """True for CuPy arrays (only possible once cupy has been imported)."""
    cp = _cupy()
    return cp is not None and isinstance(x, cp.ndarray)


def array_module(x: Any) -> ModuleType:
    """``numpy`` or ``cupy``, whichever ``x`` belongs to.

    Example:
        >>> xp = array_module(grad)      # cupy for a CuPy array
        >>> xp.__name__, xp.zeros_like(grad)
        ('numpy', array([0., 0., 0., 0.], dtype=float32))
    """
    if isinstance(x, BFloat16Array):
        x = x.array
    return _cupy() if is_device_array(x) else np


def to_array(obj: Any, call: str = "to_array", arg: str = "x") -> Any:
    """NumPy/CuPy arrays pass through; other array objects (torch tensors, anything with
    DLPack or an array interface) are wrapped zero-copy; anything else raises
    ``InvalidArgumentError`` naming ``call`` and ``arg``.

    Example:
        >>> to_array(grad, "step", "grads['w']") is grad    # NumPy and CuPy arrays pass through
        True
        >>> class Tensor:                                     # as a CPU torch tensor: no copy
        ...     def __init__(self, data):
        ...         self.__array_interface__ = data.__array_interface__
        ...         self.data = data
        >>> g = to_array(Tensor(grad), "step", "grads['w']")  # a NumPy or CuPy view of it
        >>> np.shares_memory(g, grad)
        True
        >>> to_array([1.0], "step", "grads['w']")
        Traceback (most recent call last):
        collectives._errors.InvalidArgumentError: step: grads['w'] must be a NumPy or CuPy array (or expose DLPack), got list
    """
    if isinstance(obj, (np.ndarray, BFloat16Array)) or is_device_array(obj):
        return obj
    if hasattr(obj, "__cuda_array_interface__"):
        import cupy

        return cupy.asarray(obj)
    if hasattr(obj, "__dlpack_device__"):
        device_type = obj.__dlpack_device__()[0]
        if device_type in (2, 3, 13):  # kDLCUDA, kDLCUDAHost, kDLCUDAManaged
            import cupy

            return cupy.from_dlpack(obj)
        return np.from_dlpack(obj)
    if hasattr(obj, "__array_interface__"):
        return np.asarray(obj)
    raise InvalidArgumentError(
        f"{call}: {arg} must be a NumPy or CuPy array (or expose DLPack), got {type(obj).__name__}"
    )


#: the name of each dtype of the library in this machine's byte order (a swapped dtype is not
#: equal to its native twin, so it is not found here)
_NAME_OF_NATIVE = {np.dtype(char): name for char, name in NAME_OF_CHAR.items()}


def unwrap(x: Any, call: str, arg: str = "x") -> tuple[Any, str]:
    """(storage array, dtype name) for an accepted array, after the local checks."""
    if type(x) in _PLAIN:  # the hot path: one lookup, one flag
        name = _NAME_OF_NATIVE.get(x.dtype)
        if name is not None and x.flags.c_contiguous:
            return x, name
    return _unwrap(x, call, arg)


#: the array types taken as they are when of a dtype of ``_NAME_OF_NATIVE`` and C-contiguous:
#: NumPy's, and CuPy's once an array of it has come through ``_unwrap``
_PLAIN = {np.ndarray}


def _unwrap(x: Any, call: str, arg: str) -> tuple[Any, str]:
    if isinstance(x, BFloat16Array):
        array, name = x.array, "bfloat16"
    else:
        if is_device_array(x) and type(x) is _cupy().ndarray:
            _PLAIN.add(type(x))
        array = to_array(x, call, arg)
        if isinstance(array, BFloat16Array):
            array, name = array.array, "bfloat16"
        else:
            name = dtype_name(array.dtype, call, arg)
            if name == "bfloat16":  # ml_dtypes' NumPy bfloat16: the same bits, seen as uint16
                array = array.view(np.uint16)
    if not array.flags.c_contiguous:
        raise InvalidArgumentError(
            f"{call}: {arg} must be C-contiguous, got strides {array.strides}"
        )
    return array, name


def as_given(result: Any, name: str, x: Any, out: Any = None) -> Any:
    """What a call hands back, in the dtype the caller passed.

    bfloat16 travels as uint16 bits. Where the caller passed an array of a bfloat16 dtype
    (ml_dtypes' on NumPy, CuPy's should it gain one), the result is the caller's own array
    when the call wrote there, or the array the call allocated seen with that dtype; an
    ``as_bfloat16`` call gets uint16 bits back, as it passed them.

    Example:
        >>> import ml_dtypes
        >>> x = np.ones(2, ml_dtypes.bfloat16)
        >>> comm.all_gather(x).dtype  # bfloat16, not uint16
        dtype(bfloat16)
    """
    if name != "bfloat16" or result is None:
        return result
    for given in (out, x):
        if isinstance(given, BFloat16Array):
            if given.array is result:
                return result
        elif _same_memory(given, result):
            return given
    dtype = getattr(x, "dtype", None)
    return result.view(dtype) if _is_bfloat16_dtype(dtype) else result


def _same_memory(given: Any, result: Any) -> bool:
    """True when ``result`` is a view of all of ``given`` (an array of a bfloat16 dtype)."""
    return (
        (isinstance(given, np.ndarray) or is_device_array(given))
        and _is_bfloat16_dtype(given.dtype)
        and given.shape == result.shape
        and _address(given) == _address(result)
    )


def _is_bfloat16_dtype(dtype: Any) -> bool:
    return isinstance(dtype, np.dtype) and dtype.name == "bfloat16"


def same_kind(call: str, x: Any, x_name: str, out: Any, out_name: str, shape: tuple) -> None:
    """``out`` must match ``x``'s dtype and array module, and have ``shape``."""
    if out_name != x_name:
        raise InvalidArgumentError(
            f"{call}: out has dtype {out_name}, expected {x_name} (the dtype of x)"
        )
    if type(out) is not type(x):
        raise InvalidArgumentError(
            f"{call}: out is a {type(out).__module__}.{type(out).__name__}, expected a "
            f"{type(x).__module__}.{type(x).__name__} like x"
        )
    if out.shape != shape:
        raise InvalidArgumentError(f"{call}: out has shape {out.shape}, expected {shape}")


# np.may_share_memory without the __array_function__ dispatch, which doubles its cost (a hot
# per-call check for out-of-place calls on views, DDP's bucket slices among them)
may_share_memory = getattr(np.may_share_memory, "_implementation", np.may_share_memory)


def separate_owners(a: Any, b: Any) -> bool:
    """Whether ``a`` and ``b`` are two arrays that each own their memory, and so share none
    (no extents to compare).

    Example:
        >>> a, b = np.zeros(4), np.zeros(4)
        >>> separate_owners(a, b), separate_owners(a, a), separate_owners(a, a[1:])
        (True, False, False)
    """
    return a is not b and a.base is None and b.base is None


def overlap_check(call: str, x: Any, out: Any) -> bool:
    """True when ``out`` is ``x``'s memory (in place); partial overlap is an error."""
    if x is out:
        return True
    if separate_owners(x, out):
        return False
    if isinstance(x, np.ndarray) and not may_share_memory(x, out):
        return False  # a C-level extent check: the common answer for views
    x_ptr, out_ptr = _address(x), _address(out)
    if x_ptr == out_ptr and x.nbytes == out.nbytes:
        return True
    if x.nbytes and out.nbytes and x_ptr < out_ptr + out.nbytes and out_ptr < x_ptr + x.nbytes:
        raise InvalidArgumentError(
            f"{call}: out overlaps x without being the same memory; pass distinct buffers"
        )
    return False


def extents_meet(a: Any, b: Any) -> bool:
    """Whether the memory of ``a`` and of ``b`` (contiguous arrays) has a byte in common.

    Example:
        >>> buf = np.zeros(4)
        >>> extents_meet(buf[:2], buf[1:3]), extents_meet(buf[:2], buf[2:]), extents_meet(buf, np.zeros(4))
        (True, False, False)
    """
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(may_share_memory(a, b))
    if not a.nbytes or not b.nbytes:
        return False
    a_ptr, b_ptr = _address(a), _address(b)
    return a_ptr < b_ptr + b.nbytes and b_ptr < a_ptr + a.nbytes


def _address(a: Any) -> int:
    """The address of an array's first byte.

    Example:
        >>> a = np.arange(6.0).reshape(3, 2)
        >>> frozen = a[1:]
        >>> frozen.flags.writeable = False
        >>> views = (a, a[2], frozen, a[:, 1], a[::-1])  # read-only, strided, reversed
        >>> [_address(v) - _address(a) for v in views]
        [0, 32, 16, 8, 32]
    """
    if isinstance(a, np.ndarray):
        try:
            return _BUFFER(a).address
        except (BufferError, TypeError, ValueError):  # not contiguous, or not a plain buffer
            return a.__array_interface__["data"][0]
    return a.data.ptr


#: mpi4py's view of a buffer (``MPI.memory`` before mpi4py 4): the cheapest way to a NumPy
#: array's address, read-only arrays included (``ctypes`` takes writeable ones only, and
#: ``__array_interface__`` builds a dict each time), so cheap that no address is remembered
_BUFFER = getattr(MPI, "buffer", None) or MPI.memory


def is_slot(part: Any, whole: Any, index: int) -> bool:
    """True when ``part`` is exactly ``whole[index]`` (the in-place forms of gather/scatter)."""
    if part is None or whole is None or part.nbytes * whole.shape[0] != whole.nbytes:
        return False
    if separate_owners(part, whole):
        return False
    if isinstance(part, np.ndarray):
        base = part.base  # a view of whole, or of the array whole views: no bounds to compare
        if base is None or (base is not whole and base is not whole.base):
            if not may_share_memory(part, whole):
                return False
    return _address(part) == _address(whole) + index * part.nbytes
