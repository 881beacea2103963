# The types of the C module _callbooks.c (the books every call keeps; _books.py documents them).
from collections import deque
from typing import Any, Callable

class Entry:
    seq: int
    call: str
    shape: tuple | None
    dtype: str | None
    start: float
    end: float
    def __init__(self, seq: int, call: str, shape: tuple | None, dtype: str | None) -> None: ...

class CallBooks:
    busy: bool
    seq: int
    p2p: int
    slot: int
    rank: int
    size: int
    next_check: int
    last_call: float
    quiet: float
    yield_after: float
    owner: int
    grouped: bool
    blocking: bool
    kept_bytes: int
    kept_all_to_all_in_place: bool
    checker: Any
    recorder: deque
    wait_long: Callable[[Any, Entry, tuple], None]
    pending: Any
    mpi_error: Any
    held: list[Work] | None
    handle: Any
    front: Any
    in_flight: frozenset[Work]
    slots: Any
    inside: Any
    def __init__(
        self,
        slots: Any,
        slot: int,
        recorder_length: int,
        yield_after: float,
        wait_long: Callable[[Any, Entry, tuple], None],
        rank: int,
        size: int,
        inside: Any = None,
    ) -> None: ...
    def take(self, call: str) -> None: ...
    def give(self) -> None: ...
    def hand_over(self) -> None: ...
    def forget_board(self) -> None: ...
    def let_go_kept(self) -> int: ...
    def number(
        self, call: str, array: Any, name: Any, op: Any, root: Any, async_op: bool
    ) -> int: ...
    def all_reduce(self, x: Any, op: Any, out: Any, async_op: bool) -> Any: ...
    def broadcast(self, x: Any, root: Any, async_op: bool) -> Any: ...
    def reduce(self, x: Any, root: Any, op: Any, out: Any, async_op: bool) -> Any: ...
    def all_gather(self, x: Any, out: Any, async_op: bool) -> Any: ...
    def reduce_scatter(self, x: Any, op: Any, out: Any, async_op: bool) -> Any: ...
    def all_to_all(self, x: Any, out: Any, async_op: bool) -> Any: ...
    def gather(self, x: Any, root: Any, out: Any, async_op: bool) -> Any: ...
    def scatter(self, x: Any, root: Any, out: Any, async_op: bool) -> Any: ...
    def send(self, x: Any, peer: Any, async_op: bool) -> Any: ...
    def recv(self, x: Any, peer: Any, async_op: bool) -> Any: ...
    def sendrecv(self, x: Any, peer: Any, out: Any, source: Any, async_op: bool) -> Any: ...
    def barrier(self, async_op: bool) -> Any: ...

class Work:
    def __init__(self, comm: Any, pending: Any, result: Any) -> None: ...
    def wait(self) -> Any: ...
    def synchronize(self) -> Any: ...
    def is_completed(self) -> bool: ...
    @property
    def event(self) -> Any: ...
    @property
    def result(self) -> Any: ...

REAP_AT: int

def configure(
    point_to_point: frozenset, in_use_error: type, in_use_text: str, mpi_exception: type
) -> None: ...
def use_primitives(
    capsule: Any,
    py_post: Callable[..., Any],
    py_poll: Callable[..., bool],
    kinds: tuple,
    ndarray: type,
    fast_type: dict,
    fast_op: dict,
    reduce_op: type,
    empty: Callable[..., Any],
    counted_reduce_scatter: int,
    counted_from: int,
    sendrecv_posted: bool,
    exchanges: bool,
    py_reduce_local: Callable[..., None],
) -> None: ...

class DirectVerb:
    def __init__(self, books: CallBooks, name: str, method: Any) -> None: ...
    def __call__(self, *args: Any, **kwargs: Any) -> Any: ...
