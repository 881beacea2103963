"""Data parallel and tensor parallel training on top of ``collectives``.

Example:
    >>> import collectives as col
    >>> from ddp import DistributedDataParallel
    >>> comm = col.init()
    >>> ddp = DistributedDataParallel(params, comm)    # params: name -> array, in model order
    >>> comm.close()
"""

from __future__ import annotations

from collectives import __version__ as __version__

from . import checkpoint, hooks, tensor_parallel
from ._buckets import Bucket, BucketSpec, assign_buckets
from ._ddp import BucketStats, DDPStats, DistributedDataParallel
from ._tune import BucketCapTuning, tune_bucket_cap
from .clip import clip_grad_norm
from .load_balance import LoadBalancer
from .local_sgd import LocalSGD
from .loss_scale import LossScaler
from .optim import SGD, AdamW, state_nbytes
from .sharded import ShardedArray
from .zero import ZeroOptimizer

__all__ = [
    "AdamW",
    "Bucket",
    "BucketCapTuning",
    "BucketSpec",
    "BucketStats",
    "DDPStats",
    "DistributedDataParallel",
    "LoadBalancer",
    "LocalSGD",
    "LossScaler",
    "SGD",
    "ShardedArray",
    "ZeroOptimizer",
    "assign_buckets",
    "checkpoint",
    "clip_grad_norm",
    "hooks",
    "state_nbytes",
    "tensor_parallel",
    "tune_bucket_cap",
]
