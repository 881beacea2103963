"""Simulate a schedule from per-action costs: makespan, bubble fraction, per-rank timeline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from collectives import InvalidArgumentError

from ._action import Action, B, F, I, W, grid
from ._schedule import Schedule


@dataclass(frozen=True)
class Event:
    """One action on one rank, from ``start`` to ``end`` (in the units of the costs)."""

    rank: int
    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class Simulation:
    """What :func:`simulate` found: ``timeline[rank]`` lists that rank's events in order."""

    schedule: Schedule
    makespan: float
    bubble_fraction: float
    timeline: tuple[tuple[Event, ...], ...]

    @property
    def peak_activations(self) -> tuple[float, ...]:
        """Per rank, the most activations held at once, in microbatches through one full
        stage (a chunk of a c-chunk schedule counts 1/c): held from the start of a forward
        to the end of its B or W."""
        return peak_activations(self.schedule)

    @property
    def busy(self) -> tuple[float, ...]:
        """Time each rank spends computing."""
        return tuple(_busy(row) for row in self.timeline)

    @property
    def bubble(self) -> float:
        """Idle time summed over ranks: ``ranks * makespan - sum(busy)``."""
        return self.schedule.ranks * self.makespan - sum(self.busy)

    def grid(self, unit: float | None = None) -> str:
        """A ranks x time text picture, one cell per ``unit`` of time (default: smallest cost)."""
        return grid(self.schedule, self.timeline, unit)


def peak_activations(schedule: Schedule) -> tuple[float, ...]:
    """Per rank, the most activations alive at once (see ``Simulation.peak_activations``).

    >>> from pipeline.schedules import one_f_one_b
    >>> peak_activations(one_f_one_b(4, 8))
    (4.0, 3.0, 2.0, 1.0)
    """
    share, peaks = 1.0 / schedule.chunks, []
    for acts in schedule.actions:
        alive = peak = 0
        for a in acts:
            if a.kind is F:
                alive += 1
                peak = max(peak, alive)
            elif a.kind in (B, W):
                alive -= 1
        peaks.append(peak * share)
    return tuple(peaks)


def from_trace(schedule: Schedule, traces: Sequence[Sequence[tuple]]) -> Simulation:
    """A :class:`Simulation` of what really happened: ``traces[rank]`` lists
    ``(action, start, end)`` as ``pipeline.run(..., trace=...)`` records them (seconds; the
    ranks' clocks are taken as one, so gather traces after a barrier-aligned step)."""
    origin = min((start for rows in traces for _, start, _ in rows), default=0.0)
    timeline = tuple(
        tuple(Event(r, a, s - origin, e - origin) for a, s, e in rows)
        for r, rows in enumerate(traces)
    )
    makespan = max((e.end for row in timeline for e in row), default=0.0)
    busy = sum(e.end - e.start for row in timeline for e in row)
    bubble = 1.0 - busy / (schedule.ranks * makespan) if makespan > 0 else 0.0
    return Simulation(schedule, makespan, bubble, timeline)


def costs(schedule: Schedule, forward: float, backward: float, weight: float | None) -> dict:
    """Cost of each action kind; a split backward costs ``backward - weight`` + ``weight``."""
    if weight is None:
        weight = backward / 2
    for name, value in (("forward", forward), ("backward", backward), ("weight", weight)):
        if value < 0:
            raise InvalidArgumentError(f"simulate: {name} is {value}, expected >= 0")
    if weight > backward:
        raise InvalidArgumentError(
            f"simulate: weight is {weight}, expected <= backward={backward} (it is part of it)"
        )
    return {F: forward, B: backward, I: backward - weight, W: weight}


def simulate(
    schedule: Schedule,
    forward: float = 1.0,
    backward: float = 2.0,
    weight: float | None = None,
    *,
    comm: float = 0.0,
    overlap: float | None = None,
    saving: float | None = None,
) -> Simulation:
    """Run ``schedule`` on paper: each rank does its actions in order, each as soon as its
    inputs are there.

    Args:
        forward, backward: cost of one forward / one full backward of one stage (chunk).
        weight: the weight-gradient half (W) of ``backward`` where the schedule splits it;
            the input-gradient half (I) costs ``backward - weight``. Default ``backward / 2``.
        comm: cost of one hop of an activation or gradient between two ranks.
        overlap: cost of a forward and a backward that the schedule overlaps (its
            ``overlaps``: DualPipeV's pairs); both start once both inputs are there and end
            together. Default: the sum of the two costs (they share the device; set it
            lower where the overlap hides communication, as DualPipe's does).
        saving: instead of ``overlap``, what a pair saves over its two costs summed (a
            pair of F and B then costs ``F + B - saving``, one of F and I ``F + I -
            saving``): the model for overlap that hides a fixed amount of communication.

    Returns:
        A :class:`Simulation` with ``makespan``, ``bubble_fraction`` =
        1 - busy / (ranks x makespan) and ``timeline``.

    Example (the textbook numbers: bubble (p - 1) / (m + p - 1))::

        >>> from pipeline.schedules import one_f_one_b
        >>> sim = simulate(one_f_one_b(4, 8), forward=1, backward=2)
        >>> sim.makespan, round(sim.bubble_fraction, 4)
        (33.0, 0.2727)
    """
    cost = costs(schedule, forward, backward, weight)
    if overlap is not None and saving is not None:
        raise InvalidArgumentError(
            f"simulate: overlap is {overlap} and saving is {saving}, expected at most one"
        )
    p, last = schedule.ranks, schedule.stages - 1
    done: dict[tuple[str, int, int], float] = {}  # ("F"|"G"|"W", stage, microbatch) -> end
    free = [0.0] * p
    position = [0] * p
    rows: list[list[Event]] = [[] for _ in range(p)]
    remaining = sum(len(a) for a in schedule.actions)
    while remaining:
        progressed = False
        for r in range(p):
            acts = schedule.actions[r]
            while position[r] < len(acts):
                at = position[r]
                group = acts[at : at + 2] if (r, at) in schedule.overlaps else acts[at : at + 1]
                stages = [schedule.stage_of(r, a.chunk) for a in group]
                readies = [
                    _ready(schedule, a, s, done, last, r, comm) for a, s in zip(group, stages)
                ]
                if any(ready is None for ready in readies):
                    break
                start = max([free[r]] + readies)
                took = sum(cost[a.kind] for a in group)
                if len(group) == 2 and overlap is not None:
                    took = overlap
                elif len(group) == 2 and saving is not None:
                    took = max(took - saving, 0.0)
                end = start + took
                free[r] = end
                for action, stage in zip(group, stages):
                    key = "F" if action.kind is F else "W" if action.kind is W else "G"
                    done[(key, stage, action.microbatch)] = end
                    rows[r].append(Event(r, action, start, end))
                position[r] += len(group)
                remaining -= len(group)
                progressed = True
        if not progressed:
            stuck = {
                r: str(schedule.actions[r][position[r]])
                for r in range(p)
                if position[r] < len(schedule.actions[r])
            }
            raise InvalidArgumentError(
                f"simulate: schedule {schedule.name!r} cannot finish: ranks wait forever at "
                f"{stuck}; schedule.validate() says why\n{grid(schedule)}"
            )
    makespan = max(free) if p else 0.0
    busy = sum(_busy(row) for row in rows)
    bubble = 1.0 - busy / (p * makespan) if makespan > 0 else 0.0
    return Simulation(schedule, float(makespan), bubble, tuple(tuple(r) for r in rows))


def period(schedule: Schedule, *costs: Any, **options: Any) -> float:
    """Time per step once steps follow each other with no flush between them: each rank
    starts the next step's actions as soon as its own are done (as the zero-bubble papers
    do, with the optimizer step validated after the fact). ``costs`` (forward, backward,
    weight) and ``options`` (comm, overlap, saving) as for :func:`simulate`.

    ZB-H2's warm-up makes its steps interlock; at F = I = W its period is the work alone:

        >>> from pipeline.schedules import zero_bubble, zero_bubble_h2
        >>> period(zero_bubble_h2(4, 8), 1, 2, 1), period(zero_bubble(4, 8), 1, 2, 1)
        (24.0, 27.0)
    """
    steps = schedule.ranks + 2  # enough for the start-up to have settled
    spans = [simulate(_repeat(schedule, k), *costs, **options) for k in (steps, steps + 1)]
    return spans[1].makespan - spans[0].makespan


def _repeat(schedule: Schedule, steps: int) -> Schedule:
    """``steps`` copies of ``schedule`` back to back; step s has microbatches s*m .. s*m+m-1."""
    m = schedule.microbatches
    rows = tuple(
        tuple(Action(a.chunk, a.kind, s * m + a.microbatch) for s in range(steps) for a in acts)
        for acts in schedule.actions
    )
    overlaps = frozenset(
        (r, s * len(schedule.actions[r]) + i) for s in range(steps) for r, i in schedule.overlaps
    )
    return Schedule(schedule.ranks, m * steps, schedule.chunks, rows, schedule.name,
                    schedule.layout, overlaps)  # fmt: skip


def _busy(row: Sequence[Event]) -> float:
    """Time a rank computes; the two events of an overlapped pair share one interval."""
    return sum(
        e.end - e.start
        for k, e in enumerate(row)
        if k == 0 or (e.start, e.end) != (row[k - 1].start, row[k - 1].end)
    )


def _ready(schedule, action, stage, done, last, rank, comm):
    """When the inputs of ``action`` are there, or None if not yet known."""
    m = action.microbatch
    if action.kind is F:
        if stage == 0:
            return 0.0
        end = done.get(("F", stage - 1, m))
        hop = comm if schedule.place(stage - 1)[0] != rank else 0.0
        return None if end is None else end + hop
    if action.kind is W:
        return done.get(("G", stage, m))
    own = done.get(("F", stage, m))
    if own is None:
        return None
    if stage == last:
        return own
    end = done.get(("G", stage + 1, m))
    hop = comm if schedule.place(stage + 1)[0] != rank else 0.0
    return None if end is None else max(own, end + hop)
