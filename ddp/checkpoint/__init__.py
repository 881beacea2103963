"""Checkpoints of sharded training state: parallel, atomic, async, resharded on load.

A state is a mapping of global names (see :mod:`ddp.checkpoint._shard`): arrays, blocks of
larger tensors (:class:`Shard`), JSON values, and objects with ``state_dict()``
(``DistributedDataParallel``, ``ZeroOptimizer``, the tensor-parallel layers,
``ShardedArray``, ``LoadBalancer``). :func:`save` writes it from every rank at once as
safetensors files plus a JSON index; :func:`load` fills the same names on any mesh.
Format and guarantees: docs/checkpoint.md.

Example::

    from ddp import checkpoint

    state = {"model": ddp, "optim": zero, "step": step}
    checkpoint.save("ckpt", state, comm, step=step, keep=2)
    ...
    values = checkpoint.load("ckpt", state, comm)  # the newest complete checkpoint
    step = values["step"]
"""

from __future__ import annotations

from ._format import VERSION, CheckpointError
from ._load import load, resolve
from ._objects import OptimizerState, Placed
from ._save import SaveHandle, assign_writers, latest, save
from ._shard import Shard, flat_range_blocks, flat_space_shards, flatten_state

__all__ = [
    "VERSION",
    "CheckpointError",
    "OptimizerState",
    "Placed",
    "SaveHandle",
    "Shard",
    "assign_writers",
    "flat_range_blocks",
    "flat_space_shards",
    "flatten_state",
    "latest",
    "load",
    "resolve",
    "save",
]
