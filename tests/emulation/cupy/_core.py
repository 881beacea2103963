"""``cupy.ndarray`` on emulated device memory, and NumPy's functions as CuPy's.

An array is a NumPy view of memory that belongs to one emulated device. Every computation on
arrays runs as a kernel on the current stream of the current device (after what is queued
there) and refuses what CuPy refuses: arrays of another device, NumPy arrays, and implicit
conversion to NumPy (``numpy.asarray(a)``; ``a.get()`` is the explicit way).
"""

from __future__ import annotations

import functools
import types
from typing import Any

import numpy as np

from .cuda import _gpu
from .cuda._objects import current_stream


class MemoryPointer:
    """``cupy.cuda.MemoryPointer``: ``ptr`` (an address), ``device`` and the memory."""

    __slots__ = ("mem", "ptr")

    def __init__(self, mem: _gpu.Memory, ptr: int):
        self.mem = mem
        self.ptr = ptr

    @property
    def device_id(self) -> int:
        return self.mem.device

    @property
    def device(self) -> Any:
        from .cuda import Device

        return Device(self.mem.device)


class _Flags:
    __slots__ = ("_a",)

    def __init__(self, a: np.ndarray):
        self._a = a

    @property
    def c_contiguous(self) -> bool:
        return bool(self._a.flags.c_contiguous)

    @property
    def f_contiguous(self) -> bool:
        return bool(self._a.flags.f_contiguous)

    @property
    def owndata(self) -> bool:
        return False

    def __getitem__(self, key: str) -> bool:
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous}[key]


_IMPLICIT = (
    "Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct a "
    "NumPy array explicitly."
)


def _kernel_queue(device: int) -> _gpu.Queue:
    return current_stream(device)._queue()


def _check_same_device(arrays: list[ndarray]) -> int:
    """The current device, which every array must be on (CuPy's check for a kernel; the
    emulated GPUs have no peer access)."""
    device = _gpu.current_device()
    for a in arrays:
        if a._mem.device != device:
            raise ValueError(
                "Array device must be same as the current device: array device = "
                f"{a._mem.device} while current = {device}"
            )
    return device


class ndarray:
    """``cupy.ndarray(shape, dtype=float, memptr=None, strides=None, order='C')``."""

    __array_priority__ = 100

    def __init__(self, shape: Any, dtype: Any = float, memptr: Any = None,
                 strides: Any = None, order: str = "C"):  # fmt: skip
        dtype = np.dtype(dtype)
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
        if memptr is None:
            mem = _gpu.allocate(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize)
            view = np.ndarray(shape, dtype, buffer=mem.bytes, order=order)  # type: ignore[call-overload]
        else:
            found = _gpu.find(memptr.ptr)
            if found is None:
                raise ValueError(f"{memptr.ptr:#x} is not memory of an emulated device")
            mem, offset = found
            view = np.ndarray(shape, dtype, buffer=mem.bytes, offset=offset, strides=strides)
        self._a = view
        self._mem = mem

    _base: ndarray | None = None

    @classmethod
    def _of(cls, view: np.ndarray, mem: _gpu.Memory, base: ndarray | None = None) -> ndarray:
        a = cls.__new__(cls)
        a._a, a._mem = view, mem
        if base is not None:
            a._base = base if base._base is None else base._base
        return a

    # ------------------------------------------------------------ what describes it

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    size = property(lambda self: self._a.size)
    ndim = property(lambda self: self._a.ndim)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: _Flags(self._a))

    @shape.setter  # type: ignore[no-redef]
    def shape(self, value: Any) -> None:
        self._a.shape = value

    @property
    def data(self) -> MemoryPointer:
        return MemoryPointer(self._mem, int(self._a.__array_interface__["data"][0]))

    @property
    def device(self) -> Any:
        from .cuda import Device

        return Device(self._mem.device)

    @property
    def base(self) -> Any:
        """The array whose memory this one views (None for an array that owns it)."""
        return self._base

    @property
    def __cuda_array_interface__(self) -> dict:
        interface = dict(self._a.__array_interface__)
        interface["version"] = 3
        interface["stream"] = 1
        interface.pop("mask", None)
        return interface

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, self._mem.device)  # kDLCUDA

    def __dlpack__(self, stream: Any = None, **kwargs: Any) -> Any:
        raise BufferError("the emulated device's memory cannot be shared through DLPack")

    # ------------------------------------------------------------ host transfers

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        raise TypeError(_IMPLICIT)

    def get(self, stream: Any = None, order: str = "C", out: Any = None,
            blocking: bool = True) -> np.ndarray:  # fmt: skip
        queue = (stream or current_stream(self._mem.device))._queue()
        copy = _gpu.run_on(queue, lambda: np.array(self._a, order=order))  # type: ignore[call-overload]
        if out is not None:
            out[...] = copy
            return out
        return copy

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"Only numpy.ndarray can be set to cupy.ndarray, got {type(arr)}")
        queue = (stream or current_stream(self._mem.device))._queue()
        _gpu.run_on(queue, lambda: np.copyto(self._a, arr))

    def tolist(self) -> Any:
        return self.get().tolist()

    def item(self, *args: Any) -> Any:
        return self.get().item(*args)

    def __float__(self) -> float:
        return float(self.get())

    def __int__(self) -> int:
        return int(self.get())

    def __complex__(self) -> complex:
        return complex(self.get())

    def __bool__(self) -> bool:
        return bool(self.get())

    def __index__(self) -> int:
        return self.get().__index__()

    def __len__(self) -> int:
        return len(self._a)

    def __iter__(self) -> Any:
        return (self[i] for i in range(len(self)))

    def __repr__(self) -> str:
        return repr(self.get()).replace("array(", "array(", 1)

    def __str__(self) -> str:
        return str(self.get())

    def __format__(self, spec: str) -> str:
        return format(self.get(), spec) if self.ndim == 0 else str(self)

    # ------------------------------------------------------------ views and kernels

    def __getitem__(self, key: Any) -> ndarray:
        key = _index(key)
        if not isinstance(key, tuple):
            key = (key,)
        if not any(k is Ellipsis for k in key):
            key = (*key, Ellipsis)  # an element is a 0-d view, as in CuPy
        view = self._a[key]
        if isinstance(view, np.ndarray) and np.shares_memory(view, self._a):
            return ndarray._of(view, self._mem, self)
        return _kernel(lambda: self._a[key], [self])  # advanced indexing: a copy

    def __setitem__(self, key: Any, value: Any) -> None:
        arrays = [self] + ([value] if isinstance(value, ndarray) else [])
        device = _check_same_device(arrays)
        key = _index(key)
        value = value._a if isinstance(value, ndarray) else value

        def assign() -> None:
            self._a[key] = value

        _gpu.run_on(_kernel_queue(device), assign)

    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: Any, **kwargs: Any) -> Any:
        return _call(getattr(ufunc, method), inputs, kwargs)

    def __array_function__(self, func: Any, types: Any, args: Any, kwargs: Any) -> Any:
        return _call(func, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        attribute = getattr(self._a, name)
        if not callable(attribute):
            return _wrap(attribute, self._mem) if isinstance(attribute, np.ndarray) else attribute
        method = getattr(np.ndarray, name)
        return lambda *args, **kwargs: _call(method, (self, *args), kwargs)

    def __reduce__(self) -> Any:
        raise TypeError("an emulated device array cannot be pickled; use .get()")

    def copy(self, order: str = "C") -> ndarray:
        return _kernel(lambda: self._a.copy(order=order), [self])  # type: ignore[arg-type]

    def astype(self, dtype: Any, order: str = "K", casting: Any = None, subok: Any = None,
               copy: bool = True) -> ndarray:  # fmt: skip
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        return _kernel(lambda: self._a.astype(dtype, order=order), [self])  # type: ignore[arg-type]

    def view(self, dtype: Any = None) -> ndarray:
        return ndarray._of(
            self._a.view() if dtype is None else self._a.view(dtype), self._mem, self
        )

    def reshape(self, *shape: Any, order: str = "C") -> ndarray:
        shape = shape[0] if len(shape) == 1 and not isinstance(shape[0], int) else shape
        view = self._a.reshape(shape, order=order)  # type: ignore[call-overload]
        if np.shares_memory(view, self._a) or view.size == 0:
            return ndarray._of(view, self._mem, self)
        return _kernel(lambda: self._a.reshape(shape, order=order), [self])  # type: ignore[call-overload]

    def ravel(self, order: str = "C") -> ndarray:
        return self.reshape(-1, order=order)

    def fill(self, value: Any) -> None:
        self[...] = value

    @property
    def T(self) -> ndarray:
        return ndarray._of(self._a.T, self._mem, self)

    @property
    def real(self) -> ndarray:
        return ndarray._of(self._a.real, self._mem, self)

    @property
    def imag(self) -> ndarray:
        return ndarray._of(self._a.imag, self._mem, self)

    def __matmul__(self, other: Any) -> Any:
        return _call(np.matmul, (self, other), {})

    def __rmatmul__(self, other: Any) -> Any:
        return _call(np.matmul, (other, self), {})


def _unary(name: str) -> Any:
    forward = getattr(np.ndarray, name)

    def method(self: ndarray) -> Any:
        return _call(forward, (self,), {})

    method.__name__ = name
    return method


def _binary(name: str) -> Any:
    forward = getattr(np.ndarray, name)

    def method(self: ndarray, other: Any) -> Any:
        return _call(forward, (self, other), {})

    method.__name__ = name
    return method


for _name in (
    "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
    "__rtruediv__", "__floordiv__", "__rfloordiv__", "__mod__", "__rmod__", "__pow__",
    "__rpow__", "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__",
    "__lshift__", "__rlshift__", "__rshift__", "__rrshift__", "__lt__", "__le__", "__gt__",
    "__ge__", "__eq__", "__ne__", "__iadd__", "__isub__", "__imul__", "__itruediv__",
    "__ifloordiv__", "__imod__", "__ipow__", "__iand__", "__ior__", "__ixor__",
    "__ilshift__", "__irshift__", "__neg__", "__pos__", "__abs__", "__invert__",
):  # fmt: skip
    unary = _name in ("__neg__", "__pos__", "__abs__", "__invert__")
    setattr(ndarray, _name, (_unary if unary else _binary)(_name))
ndarray.__hash__ = None  # type: ignore[assignment]


# ---------------------------------------------------------------- the kernel rule


def _unwrap(value: Any, device: int, arrays: list | None = None) -> Any:
    """``value`` with every emulated array replaced by its NumPy view; NumPy arrays are
    refused as CuPy refuses them."""
    if isinstance(value, ndarray):
        if arrays is not None:
            arrays.append(value)
        return value._a
    if isinstance(value, np.ndarray):
        raise TypeError(f"Unsupported type {type(value)}")
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrap(v, device, arrays) for v in value)
    if isinstance(value, dict):
        return {k: _unwrap(v, device, arrays) for k, v in value.items()}
    return value


def _index(key: Any) -> Any:
    """An index with device arrays as their NumPy views (NumPy index arrays are taken)."""
    if isinstance(key, ndarray):
        return key._a
    if isinstance(key, tuple):
        return tuple(_index(k) for k in key)
    return key


def _wrap(value: Any, mem: _gpu.Memory | None = None, base: ndarray | None = None) -> Any:
    """A NumPy result as device arrays: a view of ``mem`` where it is one, else adopted as
    fresh memory of the current device."""
    if isinstance(value, np.ndarray):
        if mem is not None and value.size and np.shares_memory(value, mem.bytes):
            return ndarray._of(value, mem, base)
        if value.base is not None or not (value.flags.c_contiguous or value.flags.f_contiguous):
            value = value.copy(order="F" if value.flags.f_contiguous else "C")
        return ndarray._of(value, _gpu.Memory(_gpu.current_device(), value))
    if isinstance(value, tuple):
        return tuple(_wrap(v) for v in value)
    if isinstance(value, list):
        return [_wrap(v) for v in value]
    if isinstance(value, np.generic):
        return ndarray._of(*_adopted(np.asarray(value)))
    return value


def _adopted(value: np.ndarray) -> tuple[np.ndarray, _gpu.Memory]:
    value = value.copy()
    return value, _gpu.Memory(_gpu.current_device(), value)


def _kernel(work: Any, arrays: list[ndarray]) -> Any:
    device = _check_same_device(arrays)
    return _wrap(_gpu.run_on(_kernel_queue(device), work))


def _call(func: Any, args: Any, kwargs: Any) -> Any:
    """``func`` (a NumPy function) run as a CuPy kernel on the arguments' device."""
    device = _gpu.current_device()
    arrays: list[ndarray] = []
    plain_args = _unwrap(tuple(args), device, arrays)
    plain_kwargs = _unwrap(dict(kwargs), device, arrays)
    _check_same_device(arrays)
    out = kwargs.get("out")
    result = _gpu.run_on(_kernel_queue(device), lambda: func(*plain_args, **plain_kwargs))
    if out is not None:
        return out[0] if isinstance(out, tuple) and len(out) == 1 else out
    if result is NotImplemented:
        return result
    for a in arrays:  # an in-place operator returns its own array
        if result is a._a:
            return a
    first = arrays[0] if arrays else None
    return _wrap(result, None if first is None else first._mem, first)


# ---------------------------------------------------------------- the module's functions

#: functions that take host data and make device arrays of it
_FROM_HOST = frozenset({"array", "asarray", "asanyarray", "ascontiguousarray", "asfortranarray"})


def from_host(value: Any, dtype: Any = None, order: Any = None, copy: bool = True) -> ndarray:
    """``cupy.array``/``cupy.asarray``: NumPy data copied to the current device."""
    if isinstance(value, ndarray):
        if dtype is None or np.dtype(dtype) == value.dtype:
            if (
                order in (None, "K", "A")
                or (order == "C" and value.flags.c_contiguous)
                or (order == "F" and value.flags.f_contiguous)
            ):
                return value.copy() if copy else value
        return value.astype(dtype or value.dtype, order=order or "K")
    if hasattr(value, "__cuda_array_interface__"):
        return from_interface(value.__cuda_array_interface__)
    host = np.array(value, dtype=dtype, order=order or "K", copy=True)  # type: ignore[call-overload]
    if not host.flags.c_contiguous and order != "F":
        host = np.ascontiguousarray(host)
    memory = _gpu.Memory(_gpu.current_device(), host)
    return ndarray._of(host, memory)


def from_interface(interface: dict) -> ndarray:
    """A zero-copy view of device memory described by ``__cuda_array_interface__``."""
    ptr = interface["data"][0]
    found = _gpu.find(ptr)
    if found is None:
        raise ValueError(f"{ptr:#x} is not memory of an emulated device")
    memory, offset = found
    view = np.ndarray(
        interface["shape"], np.dtype(interface["typestr"]), buffer=memory.bytes, offset=offset,
        strides=interface.get("strides"),
    )  # fmt: skip
    return ndarray._of(view, memory)


def empty(shape: Any, dtype: Any = float, order: str = "C") -> ndarray:
    return ndarray(shape, dtype, order=order)


def empty_like(a: Any, dtype: Any = None, order: str = "K", subok: Any = None,
               shape: Any = None) -> ndarray:  # fmt: skip
    return ndarray(a.shape if shape is None else shape, a.dtype if dtype is None else dtype)


def asnumpy(a: Any, stream: Any = None, order: str = "C", out: Any = None,
            blocking: bool = True) -> np.ndarray:  # fmt: skip
    if isinstance(a, ndarray):
        return a.get(stream=stream, order=order, out=out)
    return np.asarray(a, order=order)  # type: ignore[call-overload]


def wrap_function(name: str, func: Any) -> Any:
    if name in _FROM_HOST:
        fixed = {"ascontiguousarray": "C", "asfortranarray": "F"}.get(name)
        return functools.wraps(func)(
            lambda value, dtype=None, order=None, **kw: from_host(
                value, dtype, fixed or order, copy=name == "array" and kw.get("copy", True)
            )
        )

    @functools.wraps(func)
    def cupy_function(*args: Any, **kwargs: Any) -> Any:
        return _call(func, args, kwargs)

    return cupy_function


class _Ufunc:
    """A NumPy ufunc as CuPy's: called and its methods (``at``, ``reduce``...) as kernels."""

    def __init__(self, ufunc: np.ufunc):
        self._ufunc = ufunc
        self.__name__ = ufunc.__name__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return _call(self._ufunc, args, kwargs)

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self._ufunc, name)
        if callable(attribute):
            return lambda *args, **kwargs: _call(attribute, args, kwargs)
        return attribute


def module_attribute(module: types.ModuleType, name: str, prefix: str = "") -> Any:
    """CuPy's ``name`` made from NumPy's (``module``): kernels for functions, the same
    object for dtypes, scalars and constants; AttributeError where NumPy has none."""
    try:
        attribute = getattr(module, name)
    except AttributeError:
        raise AttributeError(f"module 'cupy{prefix}' has no attribute {name!r}") from None
    if isinstance(attribute, np.ufunc):
        return _Ufunc(attribute)
    if isinstance(attribute, types.ModuleType):
        return _Submodule(attribute, f"{prefix}.{name}")
    if isinstance(attribute, type) or not callable(attribute):
        return attribute
    return wrap_function(name, attribute)


class _Submodule(types.ModuleType):
    """``cupy.linalg``, ``cupy.fft``, ``cupy.random``...: NumPy's, as kernels."""

    def __init__(self, module: types.ModuleType, prefix: str):
        super().__init__(f"cupy{prefix}")
        self._module = module
        self._prefix = prefix

    def __getattr__(self, name: str) -> Any:
        value = module_attribute(self._module, name, self._prefix)
        setattr(self, name, value)
        return value


ndarray.__module__ = "cupy"  # as CuPy names it
