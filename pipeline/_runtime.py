"""``pipeline.run``: one rank's interpreter of a schedule, over a communicator."""

from __future__ import annotations

import time
import weakref
from collections.abc import Sequence
from typing import Any, Callable, Optional

import numpy as np

from collectives import DTYPES, CommunicatorLike, InvalidArgumentError, array_module

from ._action import Action, B, F, W, grid
from ._plan import Group, Message, Op, PlanError, plan
from ._schedule import Schedule
from ._stage import Stage

#: dtype name -> its code in a header (collectives' table: every dtype the backends carry)
_CODE = {name: code for code, name in enumerate(DTYPES)}
MAX_NDIM = 8
HEADER = 3 + MAX_NDIM  # dtype code, array module (0 NumPy, 1 CuPy), ndim, dims


def run(
    schedule: Schedule,
    comm: CommunicatorLike,
    stages: Sequence[Stage],
    *,
    inputs: Optional[Sequence[Any]] = None,
    targets: Optional[Sequence[Any]] = None,
    loss_fn: Optional[Callable[[Any, Any], tuple[Any, Any]]] = None,
    trace: Optional[list] = None,
) -> Optional[list]:
    """Run this rank's part of ``schedule``: forwards, backwards and the transfers between.

    Args:
        schedule: from :mod:`pipeline.schedules` (or any valid :class:`Schedule`);
            ``schedule.ranks`` must equal ``comm.size``.
        comm: the pipeline's communicator (e.g. ``mesh["pp"]``); rank r runs ``actions[r]``.
        stages: this rank's :class:`Stage` per chunk (chunk c is model stage
            ``schedule.stage_of(comm.rank, c)``).
        inputs: on the rank of the first stage (rank 0), one array per microbatch.
        targets, loss_fn: on the rank of the last stage (``schedule.place(schedule.stages
            - 1)[0]``: the last rank, or rank 0 for V-shaped schedules), one target per
            microbatch and ``loss_fn(y, target) -> (loss, dy)``.
        trace: a list to which ``(action, start, end)`` (``time.perf_counter`` seconds, host
            side) is appended for every action, to compare with :func:`pipeline.simulate`.

    Returns:
        On the rank of the last stage, the losses in microbatch order; None elsewhere.

    Example (``comm.size`` ranks, one stage each, two microbatches)::

        >>> import pipeline
        >>> from pipeline import Stage
        >>> from pipeline.schedules import one_f_one_b
        >>> fwd, bwd = (lambda x, mb: 2 * x), (lambda dy, mb: 2 * dy)
        >>> def mse(y, t):
        ...     return float(((y - t) ** 2).mean()), 2 * (y - t) / y.size
        >>> xs, ts, last = [x, x + 1], [2 * x, 2 * x], comm.size - 1
        >>> losses = pipeline.run(one_f_one_b(comm.size, 2), comm, [Stage(fwd, bwd)],
        ...                       inputs=xs if comm.rank == 0 else None,
        ...                       targets=ts if comm.rank == last else None, loss_fn=mse)
        >>> losses              # on the last rank; None on the others (one rank here)
        [0.0, 4.0]
    """
    _check(schedule, comm, stages, inputs, targets, loss_fn)
    try:
        rows = plan(schedule)
    except PlanError:
        schedule.validate()  # raises, with the reason and a picture
        raise
    return _Runner(schedule, comm, stages, inputs, targets, loss_fn, trace).run(rows[comm.rank])


class _Runner:
    def __init__(self, schedule, comm, stages, inputs, targets, loss_fn, trace):
        self.schedule, self.comm, self.stages = schedule, comm, list(stages)
        self.inputs, self.targets, self.loss_fn, self.trace = inputs, targets, loss_fn, trace
        self.rank = comm.rank
        self.last = schedule.stages - 1
        self.index = 0  # of the action running, for error messages
        self.mailbox: dict[tuple[str, int, int], Any] = {}  # arrays waiting for their action
        self.outbox: dict[tuple[str, int, int], Any] = {}  # arrays waiting to be sent
        self.layouts: dict[tuple[int, str, int], tuple] = {}  # (peer, kind, stage) -> layout
        self.headers: dict[Message, Any] = {}  # header buffers in flight
        self.held: dict[tuple[int, int], list] = {}  # (stage, microbatch) -> its received buffers
        self.free_after_group: list = []
        self.pool = _pool(comm)
        self.losses: list = [None] * schedule.microbatches

    def run(self, row) -> Optional[list]:
        for item in row:
            if isinstance(item, Group):
                self._exchange(item.ops)
                continue
            start = time.perf_counter()
            try:
                self._compute(item)
            except InvalidArgumentError:
                raise  # the runtime's own check, which says what is wrong already
            except Exception as error:
                raise StageError(self.schedule, self.rank, self.index, error) from error
            if self.trace is not None:
                self.trace.append((item, start, time.perf_counter()))
            self.index += 1
        return self.losses if self.rank == self.schedule.place(self.last)[0] else None

    # ---------------------------------------------------------------- transfers

    def _exchange(self, ops: Sequence[Op]) -> None:
        comm = self.comm
        with comm.group():
            for op in ops:
                msg = op.message
                key = (msg.kind, msg.stage, msg.microbatch)
                if op.send and op.header:
                    comm.send(self._header_of(msg, self.outbox[key]), op.peer)
                elif op.send:
                    comm.send(self.outbox.pop(key), op.peer)
                elif op.header:
                    self.headers[msg] = _header_module(comm).zeros(HEADER, np.int64)
                    comm.recv(self.headers[msg], op.peer)
                else:
                    layout = self.layouts[(op.peer, msg.kind, msg.stage)]
                    buffer = self.pool.take(layout)
                    owner = msg.stage + 1 if msg.kind == "act" else msg.stage - 1
                    self.held.setdefault((owner, msg.microbatch), []).append(buffer)
                    self.mailbox[key] = buffer
                    comm.recv(buffer, op.peer)
        for op in ops:  # headers that just arrived say what their payloads need
            if op.header and not op.send:
                self.layouts[(op.peer, op.message.kind, op.message.stage)] = _decode(
                    self.headers.pop(op.message)
                )
        # released only now: a send in this group may have been a view of one of them
        for buffer in self.free_after_group:
            self.pool.give(buffer)
        self.free_after_group.clear()

    def _header_of(self, msg: Message, x: Any) -> Any:
        layout = _layout(x, msg)
        self.layouts[(msg.dst, msg.kind, msg.stage)] = layout
        return _encode(layout, _header_module(self.comm))

    def _route(self, kind: str, stage: int, microbatch: int, x: Any, to_stage: int) -> None:
        key = (kind, stage, microbatch)
        peer = self.schedule.place(to_stage)[0]
        if peer == self.rank:
            self.mailbox[key] = x
            return
        x = array_module(x).ascontiguousarray(x)
        sent = self.layouts.get((peer, kind, stage))
        if sent is not None and _layout(x, None) != sent:
            raise InvalidArgumentError(
                f"pipeline.run: stage {stage} {'output' if kind == 'act' else 'input gradient'} "
                f"for microbatch {microbatch} has (shape, dtype) {_layout(x, None)[2:]}, "
                f"expected {sent[2:]} as for the first microbatch: microbatches must match"
            )
        self.outbox[key] = x

    # ---------------------------------------------------------------- compute

    def _compute(self, action: Action) -> None:
        stage = self.schedule.stage_of(self.rank, action.chunk)
        m = action.microbatch
        chunk = self.stages[action.chunk]
        if action.kind is F:
            x = self.inputs[m] if stage == 0 else self.mailbox.pop(("act", stage - 1, m))
            y = chunk.forward(x, m)
            if stage == self.last:
                loss, dy = self.loss_fn(y, self.targets[m])
                self.losses[m] = loss
                self.mailbox[("grad", stage + 1, m)] = dy
            else:
                self._route("act", stage, m, y, stage + 1)
            return
        if action.kind is W:
            if chunk.backward_weight is not None:
                chunk.backward_weight(m)
            self._release(stage, m)
            return
        dy = self.mailbox.pop(("grad", stage + 1, m))
        dx = chunk.backward(dy, m)
        if stage > 0:
            self._route("grad", stage, m, dx, stage - 1)
        if action.kind is B:
            if chunk.backward_weight is not None:
                chunk.backward_weight(m)
            self._release(stage, m)

    def _release(self, stage: int, microbatch: int) -> None:
        self.free_after_group.extend(self.held.pop((stage, microbatch), ()))


class StageError(RuntimeError):
    """A stage raised inside :func:`run`; the message shows this rank's actions with the
    failing one marked ``>``, and ``__cause__`` is the stage's own exception."""

    def __init__(self, schedule: Schedule, rank: int, index: int, error: Exception):
        action = schedule.actions[rank][index]
        stage = schedule.stage_of(rank, action.chunk)
        marked = grid(schedule, mark=(rank, index)).splitlines()[rank]
        super().__init__(
            f"pipeline.run: rank {rank} failed at action {index} ({action}, model stage "
            f"{stage}) of schedule {schedule.name!r}: {type(error).__name__}: {error}\n{marked}"
        )
        self.rank, self.index, self.action = rank, index, action


def _check(schedule, comm, stages, inputs, targets, loss_fn) -> None:
    call = "pipeline.run"
    if not isinstance(schedule, Schedule):
        raise InvalidArgumentError(
            f"{call}: schedule is a {type(schedule).__name__}, expected a Schedule"
        )
    if comm.size != schedule.ranks:
        raise InvalidArgumentError(
            f"{call}: comm has size {comm.size}, expected schedule.ranks={schedule.ranks}"
        )
    if len(stages) != schedule.chunks:
        raise InvalidArgumentError(
            f"{call}: stages has {len(stages)} entries, expected one Stage per chunk "
            f"(schedule.chunks={schedule.chunks})"
        )
    m, rank = schedule.microbatches, comm.rank
    if rank == schedule.place(0)[0] and (inputs is None or len(inputs) != m):
        got = "None" if inputs is None else f"{len(inputs)} arrays"
        raise InvalidArgumentError(
            f"{call}: inputs is {got} on rank 0 (first stage), expected {m} (one per microbatch)"
        )
    if rank == schedule.place(schedule.stages - 1)[0]:
        if targets is None or len(targets) != m:
            got = "None" if targets is None else f"{len(targets)} arrays"
            raise InvalidArgumentError(
                f"{call}: targets is {got} on rank {rank} (last stage), expected {m} (one per microbatch)"
            )
        if loss_fn is None:
            raise InvalidArgumentError(
                f"{call}: loss_fn is None on rank {rank} (last stage), expected loss_fn(y, target) -> (loss, dy)"
            )


# -------------------------------------------------------------------- headers and buffers


def _layout(x: Any, msg: Optional[Message]) -> tuple:
    """(module code, dtype name, shape) of an array about to be sent."""
    name = str(x.dtype)
    if name not in _CODE or x.ndim > MAX_NDIM:
        where = f" ({msg})" if msg is not None else ""
        raise InvalidArgumentError(
            f"pipeline.run: an array sent between stages{where} has dtype {name} and "
            f"{x.ndim} dims, expected one of {', '.join(DTYPES)} and at most {MAX_NDIM} dims"
        )
    return (int(array_module(x) is not np), name, tuple(int(d) for d in x.shape))


def _encode(layout: tuple, xp: Any) -> Any:
    module, name, shape = layout
    header = np.zeros(HEADER, np.int64)
    header[:3] = (_CODE[name], module, len(shape))
    header[3 : 3 + len(shape)] = shape
    return header if xp is np else xp.asarray(header)


def _decode(header: Any) -> tuple:
    values = [int(v) for v in (header.get() if hasattr(header, "get") else header)]
    code, module, ndim = values[:3]
    return (module, DTYPES[code], tuple(values[3 : 3 + ndim]))


def _header_module(comm: CommunicatorLike) -> Any:
    """NCCL moves device memory only; the MPI backend takes host arrays."""
    return comm.xp


class _Pool:
    """Receive buffers by layout, reused across microbatches and across calls."""

    def __init__(self) -> None:
        self.free: dict[tuple, list] = {}

    def take(self, layout: tuple) -> Any:
        spare = self.free.get(layout)
        if spare:
            return spare.pop()
        module, name, shape = layout
        if module:
            import cupy as xp
        else:
            xp = np
        return xp.empty(shape, name)

    def give(self, buffer: Any) -> None:
        layout = (int(array_module(buffer) is not np), str(buffer.dtype), tuple(buffer.shape))
        self.free.setdefault(layout, []).append(buffer)


_POOLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _pool(comm: CommunicatorLike) -> _Pool:
    try:
        return _POOLS.setdefault(comm, _Pool())
    except TypeError:  # a communicator that takes no weak references: a pool per call
        return _Pool()
