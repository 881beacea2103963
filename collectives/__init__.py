"""Collectives for CuPy on NCCL, bootstrapped by MPI, with an MPI backend for NumPy arrays.

The layout, one concern a folder, each folder importing only those listed after it:

- ``_topology/``: where ranks sit (``DeviceMesh``, nodes, the hierarchical view);
- ``_mpi/`` and ``_nccl/``: the two backends, each issuing calls and answering "done yet?";
- ``_core/``: the one call path. Each verb is a method of :class:`Communicator`
  (``communicator.py``), which checks its arguments (``args.py``), keeps the books
  (``books.py``) and calls the backend's method of the same name (the interface, and the
  ``BackendContext`` through which a backend reaches the communicator: ``backend.py``), on
  both backends, synchronous or not; it holds, as objects, its ``Lifecycle`` (ownership,
  closing and failure: ``lifecycle.py``) and its ``Groups`` (``comm.group()``:
  ``grouping.py``); a pending call and its waits: ``work.py``;
- ``_safety/``: what keeps ranks in step and jobs from hanging (check mode, the progress
  board, the arrival handshake, the exit, abort and fork hooks);
- the modules beside this one: errors, ops, dtypes, arrays, the timeline.

Example:
    >>> import collectives as col
    >>> comm = col.init()                   # mpiexec -n 4 python script.py
    >>> grad = comm.xp.ones(4, comm.xp.float32)
    >>> comm.all_reduce(grad, op="avg")     # in place: the mean over ranks
    array([1., 1., 1., 1.], dtype=float32)
    >>> comm.close()

The layers above (``ddp``, ``pipeline``) use only what is exported here: ``comm.xp`` (the
backend's array module), ``array_module``, ``to_array``, ``DTYPES``, the bfloat16 rounding
(``float32_to_bfloat16``, ``bfloat16_to_float32``) and the error classes, raised as
``InvalidArgumentError(f"{call}: ...")``.

Importing it makes no MPI call, replaces no hook (``sys.excepthook``, ``sys.exit``) and
registers no exit handler: the first ``init()`` does (``_init.py``: the MPI backend's tables,
which take an MPI call and two MPI ops; the hooks of ``_safety/abort.py`` and
``_safety/exit.py``; the timeline). Two things happen at import all the same: ``from mpi4py import MPI`` initialises
MPI (mpi4py's own default, which a program that imports mpi4py itself relies on), and
``_safety/fork.py`` registers its handler for a child forked from this process, which that
initialised MPI needs from then on.
"""

from ._arrays import BFloat16Array, array_module, as_bfloat16, to_array
from ._communicator_like import CommunicatorLike
from ._core.communicator import Communicator
from ._core.work import Work
from ._dtypes import DTYPES
from ._errors import (
    BackendUnavailableError,
    CollectiveMismatchError,
    CollectivesError,
    CollectiveTimeoutError,
    CommunicatorStateError,
    InvalidArgumentError,
)
from ._init import BackendFallbackWarning, init
from ._numerics import bfloat16_to_float32, float32_to_bfloat16
from ._ops import ReduceOp
from ._safety.abort import abort_on_exception
from ._topology.hierarchical import HierarchicalCommunicator, hierarchical
from ._topology.mesh import DeviceMesh
from ._version import __version__ as __version__

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
