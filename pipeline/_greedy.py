"""A list scheduler: play a pipeline out in unit time steps, each rank choosing by fixed rules.

Used for the schedules whose published form is a picture rather than a formula (ZB-V,
DualPipeV). Every rank, whenever it is free, picks by priority among the actions whose
inputs are there:

1. a backward (B, or its input-gradient half I): the oldest microbatch first, the deeper
   stage first on a tie; with ``overlap``, paired with a ready forward when there is one;
2. a forward, if the rank then holds at most ``limit`` activations (in chunk units; a
   forward of a chunk other than the deepest must leave one unit free, so that a
   microbatch on its way back can always enter): the deeper stage first, then the oldest;
3. the oldest weight-gradient half (W) still owed, which frees its activation.

Costs are F = I = W = 1 and B = 2 (an overlapped F and I: 2). The result is validated by
the caller's tests like any other schedule.
"""

from __future__ import annotations

from ._action import Action, B, F, I, W
from ._schedule import Schedule


def list_schedule(
    ranks: int,
    microbatches: int,
    *,
    layout: str,
    chunks: int,
    split: bool,
    limit: int,
    overlap: bool = False,
    name: str,
) -> Schedule:
    """The schedule the rules above produce (see the module docstring)."""
    shape = Schedule(ranks, microbatches, chunks, ((),) * ranks, layout=layout)
    stages, last = shape.stages, shape.stages - 1
    grad = I if split else B
    f_end: dict[tuple[int, int], int] = {}  # (stage, microbatch) -> end time
    g_end: dict[tuple[int, int], int] = {}
    next_f = [0] * stages  # next microbatch each stage forwards
    next_g = [0] * stages
    owed_w: list[list[Action]] = [[] for _ in range(ranks)]
    alive = [0] * ranks
    free = [0] * ranks
    rows: list[list[Action]] = [[] for _ in range(ranks)]
    overlaps: set[tuple[int, int]] = set()
    deepest = [max(shape.stage_of(r, c) for c in range(chunks)) for r in range(ranks)]
    remaining = ranks * chunks * microbatches * (3 if split else 2)
    time, horizon = 0, 8 * remaining + 4 * stages
    while remaining:
        if time > horizon:  # the rules cannot finish with this limit
            raise RuntimeError(f"{name}: the list scheduler made no progress with limit={limit}")
        for r in range(ranks):
            if free[r] > time:
                continue
            mine = [(c, shape.stage_of(r, c)) for c in range(chunks)]
            backwards = [
                (next_g[s], -s, c)
                for c, s in mine
                if next_g[s] < microbatches
                and f_end.get((s, next_g[s]), time + 1) <= time
                and (s == last or g_end.get((s + 1, next_g[s]), time + 1) <= time)
            ]
            forwards = [
                (-s, next_f[s], c)
                for c, s in mine
                if next_f[s] < microbatches
                and (s == 0 or f_end.get((s - 1, next_f[s]), time + 1) <= time)
                and alive[r] + 1 + (s != deepest[r]) <= limit
            ]
            chosen: list[Action] = []
            if backwards:
                m, _, c = min(backwards)
                chosen.append(Action(c, grad, m))
                if overlap and forwards:
                    _, fm, fc = min(forwards)
                    chosen.insert(0, Action(fc, F, fm))
            elif forwards:
                _, m, c = min(forwards)
                chosen.append(Action(c, F, m))
            elif owed_w[r]:
                chosen.append(owed_w[r].pop(0))
            if not chosen:
                continue
            if len(chosen) == 2:
                overlaps.add((r, len(rows[r])))
            took = 1 if len(chosen) == 1 and chosen[0].kind is not B else 2
            for action in chosen:
                s = shape.stage_of(r, action.chunk)
                if action.kind is F:
                    f_end[(s, action.microbatch)] = time + took
                    next_f[s] += 1
                    alive[r] += 1
                elif action.kind is W:
                    alive[r] -= 1
                else:
                    g_end[(s, action.microbatch)] = time + took
                    next_g[s] += 1
                    if split:
                        owed_w[r].append(Action(action.chunk, W, action.microbatch))
                    else:
                        alive[r] -= 1
                rows[r].append(action)
                remaining -= 1
            free[r] = time + took
        time += 1
    actions = tuple(tuple(row) for row in rows)
    return Schedule(ranks, microbatches, chunks, actions, name, layout, frozenset(overlaps))
