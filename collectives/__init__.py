"""Collectives for CuPy on NCCL, bootstrapped by MPI, with an MPI backend for NumPy arrays.

Where a call goes: each verb is a method of :class:`Communicator` (``_communicator.py``),
which checks its arguments (``_args.py``), keeps the books (``_books.py``) and calls the
backend's method of the same name, ``MpiBackend`` in ``_mpi.py`` or ``NcclBackend`` in
``_nccl.py`` (the interface, and the ``BackendContext`` through which a backend reaches the
communicator: ``_backend.py``). That is the one path of every call, on both backends,
synchronous or not. Ownership, closing and failure of a communicator: ``_lifecycle.py``.

Example:
    >>> import collectives as col
    >>> comm = col.init()                   # mpiexec -n 4 python script.py
    >>> comm.all_reduce(x, op="avg")

The layers above (``ddp``, ``pipeline``) use only what is exported here: ``comm.xp`` (the
backend's array module), ``array_module``, ``to_array``, ``DTYPES``, the bfloat16 rounding
(``float32_to_bfloat16``, ``bfloat16_to_float32``) and the error classes, raised as
``InvalidArgumentError(f"{call}: ...")``.

Importing it makes no MPI call, replaces no hook (``sys.excepthook``, ``sys.exit``) and
registers no exit handler: the first ``init()`` does (``_init.py``: the MPI backend's tables,
which take an MPI call and two MPI ops; the hooks of ``_abort.py`` and ``_exit.py``; the
timeline). Two things happen at import all the same: ``from mpi4py import MPI`` initialises
MPI (mpi4py's own default, which a program that imports mpi4py itself relies on), and
``_fork.py`` registers its handler for a child forked from this process, which that
initialised MPI needs from then on.
"""

from ._abort import abort_on_exception
from ._arrays import BFloat16Array, array_module, as_bfloat16, to_array
from ._communicator import Communicator
from ._communicator_like import CommunicatorLike
from ._dtypes import DTYPES
from ._errors import (
    BackendUnavailableError,
    CollectiveMismatchError,
    CollectivesError,
    CollectiveTimeoutError,
    CommunicatorStateError,
    InvalidArgumentError,
)
from ._hierarchical import HierarchicalCommunicator, hierarchical
from ._init import BackendFallbackWarning, init
from ._mesh import DeviceMesh
from ._numerics import bfloat16_to_float32, float32_to_bfloat16
from ._ops import ReduceOp
from ._work import Work

__all__ = [
    "abort_on_exception",
    "BackendFallbackWarning",
    "BFloat16Array",
    "BackendUnavailableError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "CollectivesError",
    "Communicator",
    "CommunicatorLike",
    "CommunicatorStateError",
    "DTYPES",
    "DeviceMesh",
    "HierarchicalCommunicator",
    "InvalidArgumentError",
    "ReduceOp",
    "Work",
    "array_module",
    "as_bfloat16",
    "bfloat16_to_float32",
    "float32_to_bfloat16",
    "hierarchical",
    "init",
    "to_array",
]
