"""Simulate a schedule from per-action costs: makespan, bubble fraction, per-rank timeline."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from collectives import InvalidArgumentError

from ._action import Action, B, F, I, Schedule, W


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
    def busy(self) -> tuple[float, ...]:
        """Time each rank spends computing."""
        return tuple(sum(e.end - e.start for e in row) for row in self.timeline)

    @property
    def bubble(self) -> float:
        """Idle time summed over ranks: ``ranks * makespan - sum(busy)``."""
        return self.schedule.ranks * self.makespan - sum(self.busy)

    def grid(self, unit: float | None = None) -> str:
        """A ranks x time text picture, one cell per ``unit`` of time (default: smallest cost)."""
        return grid(self.schedule, self.timeline, unit)


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
) -> Simulation:
    """Run ``schedule`` on paper: each rank does its actions in order, each as soon as its
    inputs are there.

    Args:
        forward, backward: cost of one forward / one full backward of one stage (chunk).
        weight: the weight-gradient half (W) of ``backward`` where the schedule splits it;
            the input-gradient half (I) costs ``backward - weight``. Default ``backward / 2``.
        comm: cost of one hop of an activation or gradient between two ranks.

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
                action = acts[position[r]]
                ready = _ready(action, action.stage(r, p), done, last, p, r, comm)
                if ready is None:
                    break
                start = max(free[r], ready)
                end = start + cost[action.kind]
                free[r] = end
                key = "F" if action.kind is F else "W" if action.kind is W else "G"
                done[(key, action.stage(r, p), action.microbatch)] = end
                rows[r].append(Event(r, action, start, end))
                position[r] += 1
                remaining -= 1
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
    busy = sum(e.end - e.start for row in rows for e in row)
    bubble = 1.0 - busy / (p * makespan) if makespan > 0 else 0.0
    return Simulation(schedule, float(makespan), bubble, tuple(tuple(r) for r in rows))


def _ready(action, stage, done, last, p, rank, comm):
    """When the inputs of ``action`` are there, or None if not yet known."""
    m = action.microbatch
    if action.kind is F:
        if stage == 0:
            return 0.0
        end = done.get(("F", stage - 1, m))
        return None if end is None else end + (comm if (stage - 1) % p != rank else 0.0)
    if action.kind is W:
        return done.get(("G", stage, m))
    own = done.get(("F", stage, m))
    if own is None:
        return None
    if stage == last:
        return own
    end = done.get(("G", stage + 1, m))
    return None if end is None else max(own, end + (comm if (stage + 1) % p != rank else 0.0))


def grid(
    schedule: Schedule,
    timeline: Sequence[Sequence[Event]] | None = None,
    unit: float | None = None,
) -> str:
    """Text picture of a schedule: ranks x position, or ranks x time given a ``timeline``.

    >>> from pipeline.schedules import gpipe
    >>> print(grid(gpipe(2, 2)))
    rank 0 | 0F0 0F1 0B0 0B1
    rank 1 | 0F0 0F1 0B0 0B1
    """
    width = max([len(str(a)) for row in schedule.actions for a in row] + [3])
    label = len(f"rank {schedule.ranks - 1}")
    if timeline is None:
        return "\n".join(
            f"{'rank ' + str(r):<{label}} | " + " ".join(f"{str(a):<{width}}" for a in row)
            for r, row in enumerate(schedule.actions)
        ).rstrip()
    durations = [e.end - e.start for row in timeline for e in row if e.end > e.start]
    step = unit or (min(durations) if durations else 1.0)
    end = max((e.end for row in timeline for e in row), default=0.0)
    cells = int(round(end / step))
    lines = []
    for r, row in enumerate(timeline):
        cell = [" " * (width - 1) + "."] * cells
        for e in row:
            first, stop = int(round(e.start / step)), int(round(e.end / step))
            for k in range(first, max(stop, first + 1)):
                if k < cells:
                    cell[k] = f"{str(e.action):>{width}}"
        lines.append(f"{'rank ' + str(r):<{label}} | " + " ".join(cell))
    return "\n".join(lines)
