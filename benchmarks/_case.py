"""One benchmark case: the buffers of one collective, one size, one placement, on one rank.

Our layer and the baseline run on the very same buffers, so that both see the same memory
(same pages, same cache state), and each has its inputs rewritten before a checked call.
The initial contents and the expected result are built once per case and kept on the
host: a 1 GiB case is built in about a second, not once per checked call.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from . import _data
from ._busbw import REDUCING


@dataclass
class Case:
    """Buffers for ``op`` at per-call ``count`` on this rank, out of place or in place.

    Out of place: ``send`` and ``recv`` (``recv`` starts as NaN / integer max so that
    a result never written is counted wrong). In place: ``buf`` only, laid out as the
    collectives API takes it (for all_gather and gather, this rank's block already in
    ``buf[rank]``; for ranks that are not the root of gather, reduce and scatter, the
    buffer they send or receive).
    """

    op: str
    inplace: bool
    redop: str
    dtype: np.dtype
    count: int
    root: int
    rank: int
    size: int
    xp: Any
    send: Any = None
    recv: Any = None
    buf: Any = None
    _fills: list[tuple[Any, np.ndarray]] = field(default_factory=list, repr=False)
    _expected: Any = field(default=False, repr=False)  # False: not built yet (None is a value)

    @property
    def kind(self) -> str:
        """The data pattern: the reduce op for reducing collectives, ``none`` otherwise."""
        return self.redop if self.op in REDUCING else "none"

    @property
    def is_root(self) -> bool:
        return self.rank == self.root

    def __post_init__(self) -> None:
        op, c, n = self.op, self.count, self.size

        def mine() -> np.ndarray:
            return _data.send_data(op, self.kind, self.rank, n, self.dtype, c, self.root)

        gathers = op in ("all_gather", "hypercube") or (op == "gather" and self.is_root)
        # a non-root of gather receives nothing: its (count,) buffer only has to exist
        out_shape = (n, c) if gathers or op == "all_to_all" else (c,)
        if not self.inplace:
            self.send = self._alloc(mine)
            self.recv = self._alloc(lambda: _data.sentinel(out_shape, self.dtype))
        elif gathers:
            self.buf = self._alloc(lambda: self._own_block_in_place(mine()))
        elif op == "scatter" and not self.is_root:
            self.buf = self._alloc(lambda: _data.sentinel((c,), self.dtype))
        else:
            self.buf = self._alloc(mine)

    def _own_block_in_place(self, block: np.ndarray) -> np.ndarray:
        host = _data.sentinel((self.size, self.count), self.dtype)
        host[self.rank] = block
        return host

    def _alloc(self, make: Callable[[], np.ndarray]) -> Any:
        initial = make()
        array = self.xp.array(initial)  # a copy: the initial contents stay as they were
        self._fills.append((array, initial))
        return array

    def reset(self) -> None:
        """Rewrite every buffer with its initial contents (before a checked call)."""
        for array, initial in self._fills:
            array[...] = self.xp.asarray(initial)

    def expected(self) -> np.ndarray | None:
        """What this rank must hold after one call (None where the op defines nothing);
        built on the first call, then kept."""
        if self._expected is False:
            self._expected = _data.expected(
                self.op, self.kind, self.rank, self.size, self.dtype, self.count, self.root
            )
        return self._expected
