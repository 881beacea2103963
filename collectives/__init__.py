"""Collectives for CuPy on NCCL, bootstrapped by MPI, with an MPI backend for NumPy arrays.

Example:
    >>> import collectives as col
    >>> comm = col.init()                   # mpiexec -n 4 python script.py
    >>> comm.all_reduce(x, op="avg")
"""

from ._abort import abort_on_exception, install_default
from ._arrays import BFloat16Array, array_module, as_bfloat16
from ._communicator import Communicator
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
from ._ops import ReduceOp
from ._work import Work

install_default()  # an uncaught exception on one rank of several ends the whole job

__all__ = [
    "abort_on_exception",
    "BackendFallbackWarning",
    "BFloat16Array",
    "BackendUnavailableError",
    "CollectiveMismatchError",
    "CollectiveTimeoutError",
    "CollectivesError",
    "Communicator",
    "CommunicatorStateError",
    "DeviceMesh",
    "HierarchicalCommunicator",
    "InvalidArgumentError",
    "ReduceOp",
    "Work",
    "array_module",
    "as_bfloat16",
    "hierarchical",
    "init",
]
