"""``cupyx`` of the emulated CuPy: the few functions the project uses."""

from __future__ import annotations

from typing import Any

import numpy as np
from cupy._core import _call


def scatter_add(a: Any, slices: Any, value: Any) -> None:
    """``cupyx.scatter_add(a, slices, value)``: ``a[slices] += value``, repeats added."""
    _call(np.add.at, (a, slices, value), {})
