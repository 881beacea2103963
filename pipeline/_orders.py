"""Schedules whose published form is a fixed per-rank order (a formula per phase), not a
list scheduler's play-out: ZB-V as drawn in the zero-bubble paper, DualPipeV as DeepSeek
wrote it, and interleaved 1F1B / interleaved zero bubble with rounds of any size.

Each function returns per-rank action lists (and, for DualPipeV, the overlapped pairs); the
public generators in :mod:`pipeline.schedules` wrap them in a ``Schedule``. V layouts: chunk
0 of rank r is model stage r, chunk 1 is stage ``2 * ranks - 1 - r``.
"""

from __future__ import annotations

from collections import deque

from ._action import Action, ActionKind, B, F, I, W

Rows = tuple[tuple[Action, ...], ...]


class _Counter:
    """The next microbatch of each (chunk, kind) on one rank, and the W halves owed."""

    def __init__(self) -> None:
        self.next: dict[tuple[int, ActionKind], int] = {}
        self.owed: deque[Action] = deque()
        self.row: list[Action] = []

    def add(self, chunk: int, kind: ActionKind) -> Action:
        key = (chunk, I if kind is B else kind)
        action = Action(chunk, kind, self.next.get(key, 0))
        self.next[key] = action.microbatch + 1
        if kind is I:
            self.owed.append(Action(chunk, W, action.microbatch))
        self.row.append(action)
        return action

    def count(self, chunk: int, kind: ActionKind) -> int:
        return self.next.get((chunk, kind), 0)

    def pay(self, chunk: int | None = None) -> None:
        """The oldest W owed (of ``chunk``, if given), if any."""
        for k, action in enumerate(self.owed):
            if chunk is None or action.chunk == chunk:
                del self.owed[k]
                self.row.append(action)
                return


def zbv_paper(ranks: int, microbatches: int) -> Rows:
    """ZB-V in the order of the paper's figure (Qi et al. 2024, "Pipeline Parallelism with
    Controllable Memory", section 6): warm-up forwards, then F, I, W of each chunk in turn.

    Built for ``n = max(microbatches, 2 * ranks - 1)`` microbatches (the figure needs that
    many to fill the V) and cut down to ``microbatches``; at F = I = W its steps run back to
    back at exactly 3m per rank for m >= 2 * ranks - 1.
    """
    p, n = ranks, max(microbatches, 2 * ranks - 1)
    rows = []
    for r in range(p):
        c = _Counter()
        for _ in range(2 * (p - r) - 1):
            c.add(0, F)
        for _ in range(r):
            c.add(1, F)
            c.add(0, F)
        for _ in range(p - r):
            c.add(1, F)
            c.add(1, I)
            c.pay(1)
        while c.count(1, F) < c.count(0, F) or c.count(0, F) < n:
            if c.count(0, F) < n:
                c.add(0, F)
            c.add(0, I)
            c.pay(0)
            c.add(1, F)
            c.add(1, I)
            c.pay(1)
        for _ in range(r):
            c.add(0, I)
            c.add(1, I)
        for _ in range(p - r):
            c.add(0, I)
            c.pay(0)
        while c.owed:
            c.pay(1 if any(a.chunk == 1 for a in c.owed) else 0)
        rows.append(tuple(a for a in c.row if a.microbatch < microbatches))
    return tuple(rows)


def dualpipe_v_paper(ranks: int, microbatches: int) -> tuple[Rows, frozenset[tuple[int, int]]]:
    """DualPipeV in DeepSeek's order (deepseek-ai/DualPipe, ``dualpipev.py``): eight phases
    per rank; in the main phase each forward of one chunk is paired with a full backward
    (B) of the other chunk, and the tail switches to split backward (I, then W) to fill the
    drain. Needs ``microbatches >= 2 * ranks``.

    Returns the rows and the overlapped pairs ``(rank, index of the forward)``.
    """
    p, rows, pairs = ranks, [], set()
    for r in range(p):
        c = _Counter()

        def pair(forward: int, backward: int) -> None:
            pairs.add((r, len(c.row)))  # noqa: B023 - used within this iteration only
            c.add(forward, F)  # noqa: B023
            c.add(backward, B)  # noqa: B023

        for _ in range(2 * (p - r - 1)):
            c.add(0, F)
        for _ in range(r + 1):
            c.add(0, F)
            c.add(1, F)
        for _ in range(p - r - 1):
            c.add(1, I)
            c.pay()
            c.add(1, F)
        for k in range(microbatches - 2 * p + r + 1):
            if k == 0 and r == p - 1:  # the V's tip: pairing would only delay the backward
                c.add(0, F)
                c.add(1, B)
            else:
                pair(0, 1)
            pair(1, 0)
        for _ in range(p - r - 1):
            c.add(1, B)
            pair(1, 0)
        split = False
        for k in range(r + 1):
            if k == (r + 1) // 2 and r % 2 == 1:
                split = True
            c.add(1, I if split else B)
            if k == (r + 1) // 2 and r % 2 == 0:
                split = True
            c.add(0, I if split else B)
        for _ in range(p - r - 1):
            c.pay()
            c.add(0, I if split else B)
        while c.owed:
            c.pay()
        rows.append(tuple(c.row))
    return tuple(rows), frozenset(pairs)


def rounds_of(ranks: int, microbatches: int) -> int | None:
    """The microbatches per round of an interleaved schedule: ``microbatches`` split into
    ``max(1, microbatches // ranks)`` equal rounds, or None where they do not divide it.

        >>> rounds_of(4, 8), rounds_of(4, 6), rounds_of(4, 9)
        (4, 6, None)
    """
    count = max(1, microbatches // ranks)
    return None if microbatches % count else microbatches // count


def interleaved(ranks: int, microbatches: int, chunks: int, *, split: bool) -> Rows:
    """Interleaved 1F1B (``split=False``, Megatron's order) or interleaved zero bubble
    (``split=True``, the zero-bubble paper's ZB-1P with chunks), with rounds of
    :func:`rounds_of` microbatches.

    Rank r runs ``(chunks - 1) * round + 2 * (ranks - 1 - r)`` warm-up forwards (zero
    bubble: ``+ (ranks - 1 - r)``), then one forward and one backward at a time; with
    ``split``, after its first ``r`` backward halves each I is followed by the oldest W.
    """
    group = rounds_of(ranks, microbatches)
    assert group is not None  # the caller checked
    total = microbatches * chunks
    kind = I if split else B
    rows = []
    for r in range(ranks):
        hops = (ranks - 1 - r) * (1 if split else 2)
        warmup = min((chunks - 1) * group + hops, total)
        row = [_virtual(k, group, chunks, F) for k in range(warmup)]
        owed: deque[Action] = deque()
        for k in range(total):
            if warmup + k < total:
                row.append(_virtual(warmup + k, group, chunks, F))
            action = _virtual(k, group, chunks, kind)
            row.append(action)
            if split:
                owed.append(Action(action.chunk, W, action.microbatch))
                if k >= r:  # rank r holds its first r W halves back (its extra memory)
                    row.append(owed.popleft())
        rows.append(tuple(row + list(owed)))
    return tuple(rows)


def _virtual(k: int, group: int, chunks: int, kind: ActionKind) -> Action:
    """The k-th forward (or backward) of a rank in Megatron's interleaved order: chunks take
    turns in groups of ``group`` microbatches (backwards from the deepest chunk)."""
    chunk = (k // group) % chunks
    if kind is not F:
        chunk = chunks - 1 - chunk
    microbatch = (k // (group * chunks)) * group + k % group
    return Action(chunk, kind, microbatch)
