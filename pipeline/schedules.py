"""Schedule generators: pure functions of (stages, microbatches[, chunks]) returning a Schedule.

``stages`` is the number of pipeline ranks (one model stage per rank and chunk; where each
chunk lives: ``schedule.stage_of(rank, chunk)``). :func:`best` simulates them all and picks.
Accepted microbatch counts:

- :func:`gpipe`, :func:`one_f_one_b`, :func:`zero_bubble`, :func:`zero_bubble_h2`,
  :func:`zero_bubble_v`, :func:`dualpipe_v`: any ``microbatches >= 1``
  (``dualpipe_v(..., order="paper")``: at least ``2 * stages``);
- :func:`interleaved_1f1b`, :func:`interleaved_zero_bubble`: a count that
  ``max(1, microbatches // stages)`` equal rounds divide (any multiple of ``stages``, any
  count below ``2 * stages``): the chunks take turns a round at a time.

The published orders (ZB-V's figure, DeepSeek's DualPipeV, Megatron's interleaving) are
written in ``pipeline/_orders.py``; PyTorch's schedule classes build the same orders.
"""

from __future__ import annotations

from dataclasses import dataclass

from collectives import InvalidArgumentError

from ._action import Action, B, F, I, W
from ._greedy import list_schedule
from ._orders import dualpipe_v_paper, interleaved, rounds_of, zbv_paper
from ._schedule import Schedule
from ._simulate import Simulation, period, simulate


def gpipe(stages: int, microbatches: int) -> Schedule:
    """All forwards, then all backwards (Huang et al., GPipe).

    Peak memory: every rank keeps all ``microbatches`` activations alive.

        >>> print(gpipe(2, 2).to_text())
        rank 0: 0F0 0F1 0B0 0B1
        rank 1: 0F0 0F1 0B0 0B1
    """
    _check("gpipe", stages, microbatches)
    row = [Action(0, F, m) for m in range(microbatches)]
    row += [Action(0, B, m) for m in range(microbatches)]
    return Schedule(stages, microbatches, 1, tuple(tuple(row) for _ in range(stages)), "gpipe")


def one_f_one_b(stages: int, microbatches: int) -> Schedule:
    """1F1B (PipeDream-flush): rank r warms up with ``stages - 1 - r`` forwards, then alternates.

    Same makespan as GPipe, but rank r keeps at most ``stages - r`` microbatches alive.

        >>> print(one_f_one_b(2, 3).to_text())
        rank 0: 0F0 0F1 0B0 0F2 0B1 0B2
        rank 1: 0F0 0B0 0F1 0B1 0F2 0B2
    """
    _check("one_f_one_b", stages, microbatches)
    rows = []
    for rank in range(stages):
        warmup = min(stages - 1 - rank, microbatches)
        row = [Action(0, F, m) for m in range(warmup)]
        for k in range(microbatches - warmup):
            row += [Action(0, F, warmup + k), Action(0, B, k)]
        row += [Action(0, B, m) for m in range(microbatches - warmup, microbatches)]
        rows.append(tuple(row))
    return Schedule(stages, microbatches, 1, tuple(rows), "1f1b")


def interleaved_1f1b(stages: int, microbatches: int, chunks: int) -> Schedule:
    """Interleaved 1F1B (Narayanan et al., Megatron-LM): ``chunks`` model chunks per rank.

    Chunk c of rank r is model stage ``c * stages + r``. Microbatches go through the chunks
    in rounds: ``max(1, microbatches // stages)`` equal rounds, so ``microbatches`` must be
    a multiple of that count (any multiple of ``stages``, and any count from ``stages`` to
    ``2 * stages - 1``). Rank r runs ``(chunks - 1) * round + 2 * (stages - 1 - r)`` warm-up
    forwards (at most all of them), then alternates. With the same total work per rank,
    the bubble shrinks by a factor ``chunks``.

        >>> print(interleaved_1f1b(2, 2, 2).to_text())
        rank 0: 0F0 0F1 1F0 1F1 1B0 1B1 0B0 0B1
        rank 1: 0F0 0F1 1F0 1B0 1F1 1B1 0B0 0B1
    """
    _check_interleaved("interleaved_1f1b", stages, microbatches, chunks)
    if chunks == 1:
        return one_f_one_b(stages, microbatches)
    rows = interleaved(stages, microbatches, chunks, split=False)
    return Schedule(stages, microbatches, chunks, rows, f"interleaved-1f1b x{chunks}")


def interleaved_zero_bubble(stages: int, microbatches: int, chunks: int) -> Schedule:
    """Interleaved zero bubble (Qi et al.'s ZB-1P with ``chunks`` looped chunks per rank, as
    PyTorch's ``ScheduleInterleavedZeroBubble``): interleaved 1F1B's order with backward
    split into I and W, rank r running ``stages - 1 - r`` fewer warm-up forwards and each
    W (after its first ``r``) right behind the next I.

    Accepts the microbatch counts of :func:`interleaved_1f1b`. At F = I = W its makespan is
    ``(stages - 1) / 2`` below ZB-H1's at the same peak (``stages`` microbatches) where
    ``microbatches`` is a multiple of ``stages``.

        >>> print(interleaved_zero_bubble(2, 2, 2).to_text())
        rank 0: 0F0 0F1 1F0 1F1 1I0 1W0 1I1 1W1 0I0 0W0 0I1 0W1
        rank 1: 0F0 0F1 1F0 1I0 1F1 1I1 1W0 0I0 1W1 0I1 0W0 0W1
    """
    _check_interleaved("interleaved_zero_bubble", stages, microbatches, chunks)
    rows = interleaved(stages, microbatches, chunks, split=True)
    return Schedule(stages, microbatches, chunks, rows, f"interleaved-zb x{chunks}")


def _check_interleaved(call: str, stages: int, microbatches: int, chunks: int) -> None:
    _check(call, stages, microbatches)
    if not isinstance(chunks, int) or chunks < 1:
        raise InvalidArgumentError(f"{call}: chunks is {chunks!r}, expected an int >= 1")
    if rounds_of(stages, microbatches) is None:
        count = microbatches // stages
        raise InvalidArgumentError(
            f"{call}: microbatches is {microbatches}, expected a multiple of stages={stages} "
            f"or of its {count} rounds (max(1, microbatches // stages))"
        )


def zero_bubble(stages: int, microbatches: int) -> Schedule:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism"): backward split into I and W.

    Forwards (F) and input-gradient halves (I) keep 1F1B's order; the weight-gradient
    halves (W), which nothing downstream waits for, are deferred into the slots where 1F1B
    would idle, as long as no rank holds more than ``stages`` microbatches alive (from their
    forward to their W), 1F1B's peak. At F = I = W that leaves a third of 1F1B's bubble:
    (stages - 1) units per rank instead of 3 * (stages - 1).

        >>> print(zero_bubble(2, 2).to_text())
        rank 0: 0F0 0F1 0I0 0W0 0I1 0W1
        rank 1: 0F0 0I0 0F1 0I1 0W0 0W1
    """
    _check("zero_bubble", stages, microbatches)
    warmup = [stages - rank for rank in range(stages)]
    rows = _fill_weights(stages, microbatches, warmup, limit=stages)
    return Schedule(stages, microbatches, 1, rows, "zb-h1")


def zero_bubble_h2(stages: int, microbatches: int) -> Schedule:
    """ZB-H2: as :func:`zero_bubble`, with up to ``2 * stages - 1`` microbatches alive.

    Rank r runs ``2 * (stages - 1 - r) + 1`` forwards before its first I, which fills the
    start-up bubble; W halves fill the tail. Close to zero bubble for twice 1F1B's memory.

        >>> print(zero_bubble_h2(2, 3).to_text())
        rank 0: 0F0 0F1 0F2 0I0 0W0 0I1 0W1 0I2 0W2
        rank 1: 0F0 0I0 0F1 0I1 0F2 0I2 0W0 0W1 0W2
    """
    _check("zero_bubble_h2", stages, microbatches)
    warmup = [2 * (stages - 1 - rank) + 1 for rank in range(stages)]
    rows = _fill_weights(stages, microbatches, warmup, limit=2 * stages - 1)
    return Schedule(stages, microbatches, 1, rows, "zb-h2")


#: the orders :func:`zero_bubble_v` and :func:`dualpipe_v` can take
V_ORDERS = ("auto", "paper", "greedy")


def zero_bubble_v(stages: int, microbatches: int, *, order: str = "auto") -> Schedule:
    """ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory"): two chunks per
    rank in a V, rank r holding model stages r and ``2 * stages - 1 - r``
    (``layout="v"``), backward split into I and W, at most 1F1B's peak (``stages``
    microbatches through a full stage).

    ``order``: ``"paper"`` is the paper's figure (also PyTorch's ``ScheduleZBVZeroBubble``):
    at F = I = W one step takes ``3m + (stages - 1) / 2`` and steps run back to back at
    exactly 3m (``pipeline.period``) for ``microbatches >= 2 * stages - 1``. ``"greedy"``
    comes from a list scheduler (backward first, then forward, then W), shorter when there
    are fewer microbatches. ``"auto"`` (default) takes whichever is shorter in one step at
    F = I = W, the paper's on a tie (its period is never longer there).

        >>> print(zero_bubble_v(2, 2).to_text())
        rank 0: 0F0 0F1 1F0 1I0 1F1 1I1 0I0 1W0 0I1 1W1 0W0 0W1
        rank 1: 0F0 1F0 0F1 1F1 1I0 0I0 1I1 0I1 1W0 0W0 1W1 0W1
    """
    _check("zero_bubble_v", stages, microbatches)
    _check_order("zero_bubble_v", order)
    paper = greedy = None
    if order != "greedy":
        paper = Schedule(stages, microbatches, 2, zbv_paper(stages, microbatches), "zb-v", "v")
    if order != "paper":
        greedy = list_schedule(stages, microbatches, layout="v", chunks=2, split=True,
                               limit=2 * stages, name="zb-v greedy")  # fmt: skip
    return _shorter(paper, greedy)


def dualpipe_v(stages: int, microbatches: int, *, order: str = "auto") -> Schedule:
    """DualPipeV (DeepSeek-V3's DualPipe cut in half): the V of :func:`zero_bubble_v`, with
    the forward of one microbatch and the backward of another run as one overlapped pair
    (``schedule.overlaps``, ``0F3+1B1`` in the text form).

    The overlap pays where it hides communication (DeepSeek overlaps one microbatch's
    all-to-all with another's compute); ``pipeline.simulate(..., saving=s)`` models a pair
    that costs ``s`` less than its two halves (``overlap=cost`` gives it a fixed cost).

    ``order``: ``"paper"`` is DeepSeek's (``dualpipev.py``, also PyTorch's
    ``ScheduleDualPipeV``; needs ``microbatches >= 2 * stages``): forwards paired with full
    backwards (B), split backward only in the drain, peak ``stages + 1/2``. ``"greedy"``
    comes from the list scheduler, pairing a forward with an input-gradient half (I) where
    both are ready: shorter when pairs save nothing, longer when they do, peak ``stages +
    1``. ``"auto"`` (default): the paper's where it can be built, else the greedy one;
    ``schedules.best`` compares both.
    """
    _check("dualpipe_v", stages, microbatches)
    _check_order("dualpipe_v", order)
    if order == "paper" and microbatches < 2 * stages:
        raise InvalidArgumentError(
            f"dualpipe_v: microbatches is {microbatches}, expected >= 2 * stages = "
            f"{2 * stages} for order='paper'"
        )
    if order != "greedy" and microbatches >= 2 * stages:
        rows, pairs = dualpipe_v_paper(stages, microbatches)
        return Schedule(stages, microbatches, 2, rows, "dualpipe-v", "v", pairs)
    return list_schedule(stages, microbatches, layout="v", chunks=2, split=True,
                         limit=2 * stages + 2, overlap=True, name="dualpipe-v greedy")  # fmt: skip


def _check_order(call: str, order: str) -> None:
    if order not in V_ORDERS:
        raise InvalidArgumentError(
            f"{call}: order is {order!r}, expected one of {', '.join(V_ORDERS)}"
        )


def _shorter(first: Schedule | None, second: Schedule | None) -> Schedule:
    """The one of two schedules (either may be None) with the shorter step at F = I = W."""
    options = [s for s in (first, second) if s is not None]
    return min(options, key=lambda s: simulate(s, 1 / s.chunks, 2 / s.chunks).makespan)


def _fill_weights(stages: int, microbatches: int, warmup: list[int], limit: int):
    """F and I in 1F1B order after ``warmup[rank]`` forwards; W wherever that order must wait.

    Played out in unit time steps (F = I = W = 1), every rank deciding at once: the next F
    or I runs if its input is there (and, for F, fewer than ``limit`` microbatches are
    alive); otherwise the oldest pending W runs, if any.
    """
    orders = []
    for rank in range(stages):
        w = min(warmup[rank], microbatches)
        order = [Action(0, F, m) for m in range(w)]
        for k in range(microbatches - w):
            order += [Action(0, I, k), Action(0, F, w + k)]
        order += [Action(0, I, m) for m in range(microbatches - w, microbatches)]
        orders.append(order)
    nxt = [0] * stages  # position in orders[rank]
    weights = [0] * stages  # W halves done
    inputs = [0] * stages  # I halves done
    f_end: dict[tuple[int, int], int] = {}  # (rank, microbatch) -> end time
    i_end: dict[tuple[int, int], int] = {}
    rows: list[list[Action]] = [[] for _ in range(stages)]
    time = 0
    while any(w < microbatches for w in weights):
        for r in range(stages):
            if nxt[r] < len(orders[r]):
                action = orders[r][nxt[r]]
                m = action.microbatch
                if action.kind is F:
                    ready = (r == 0 or f_end.get((r - 1, m), time + 1) <= time) and (
                        m - weights[r] < limit
                    )
                else:
                    ready = f_end[(r, m)] <= time and (
                        r == stages - 1 or i_end.get((r + 1, m), time + 1) <= time
                    )
                if ready:
                    rows[r].append(action)
                    (f_end if action.kind is F else i_end)[(r, m)] = time + 1
                    inputs[r] += action.kind is I
                    nxt[r] += 1
                    continue
            if weights[r] < inputs[r]:
                rows[r].append(Action(0, W, weights[r]))
                weights[r] += 1
        time += 1
    return tuple(tuple(row) for row in rows)


@dataclass(frozen=True)
class Candidate:
    """One schedule that :func:`best` simulated: its numbers and whether it fits in memory."""

    schedule: Schedule
    makespan: float
    bubble_fraction: float
    peak_activations: float  # the most of any rank, in microbatches through a full stage
    fits: bool
    period: float | None = None  # time per step between steps (``best(between_steps=True)``)


@dataclass(frozen=True)
class Choice:
    """What :func:`best` chose (``schedule``, ``simulation``) and everything it compared;
    ``str(choice)`` is the table."""

    schedule: Schedule
    simulation: Simulation
    compared: tuple[Candidate, ...]

    def __str__(self) -> str:
        steady = any(c.period is not None for c in self.compared)
        lines = [
            f"{'schedule':<20} {'makespan':>9} {'bubble':>7} "
            + (f"{'period':>7} " if steady else "")
            + f"{'peak act.':>9}  fits"
        ]
        for c in self.compared:
            mark = " <- best" if c.schedule is self.schedule else ""
            lines.append(
                f"{c.schedule.name:<20} {c.makespan:9.4g} {c.bubble_fraction:7.1%} "
                + (f"{c.period:7.4g} " if c.period is not None else "")
                + f"{c.peak_activations:9.3g}  {'yes' if c.fits else 'no'}{mark}"
            )
        return "\n".join(lines)


def candidates(stages: int, microbatches: int, max_chunks: int = 4) -> list[Schedule]:
    """Every schedule family for this shape: the interleaved ones with each chunk count from
    2 to ``max_chunks`` (where the rounds divide ``microbatches``), and both orders of the V
    schedules where they differ."""
    out = [gpipe(stages, microbatches), one_f_one_b(stages, microbatches)]
    looped = stages > 1 and rounds_of(stages, microbatches) is not None
    if looped:
        out += [interleaved_1f1b(stages, microbatches, c) for c in range(2, max_chunks + 1)]
    out += [zero_bubble(stages, microbatches), zero_bubble_h2(stages, microbatches)]
    if looped:
        out += [interleaved_zero_bubble(stages, microbatches, c) for c in range(2, max_chunks + 1)]
    out += [zero_bubble_v(stages, microbatches, order="paper")]
    out += [zero_bubble_v(stages, microbatches, order="greedy")]
    if microbatches >= 2 * stages:
        out += [dualpipe_v(stages, microbatches, order="paper")]
    out += [dualpipe_v(stages, microbatches, order="greedy")]
    return out


def best(
    stages: int,
    microbatches: int,
    *,
    forward: float,
    backward: float,
    weight: float | None = None,
    comm: float = 0.0,
    max_activations: float | None = None,
    overlap: float | None = None,
    saving: float | None = None,
    between_steps: bool = False,
    max_chunks: int = 4,
) -> Choice:
    """The schedule with the smallest simulated makespan whose peak activations stay within
    ``max_activations`` (in microbatches through one full stage; None: no limit).

    ``forward``, ``backward``, ``weight`` (default ``backward / 2``) are the costs of one
    full model stage per rank; a schedule with c chunks per rank runs c stages of 1/c of
    that each. ``comm`` is the cost of one hop; ``overlap`` that of an overlapped forward
    and input-gradient half of a full stage (DualPipeV; default their sum), or ``saving``
    what such a pair saves over its two halves (per full stage). Ties go to the
    smaller memory, then to the simpler schedule. ``between_steps=True`` ranks by
    :func:`pipeline.period` instead (steps back to back, no flush; slower to compute).
    ``max_chunks`` caps the chunks per rank of the looped interleaved schedules (1: none).

        >>> choice = best(4, 8, forward=1, backward=2, weight=1, max_activations=4)
        >>> choice.schedule.name, choice.simulation.makespan
        ('interleaved-zb x4', 24.75)
        >>> print(choice)  # the table of everything compared
        schedule              makespan  bubble peak act.  fits
        gpipe                       33   27.3%         8  no
        ...
        interleaved-zb x4        24.75    3.0%         4  yes <- best
        ...
    """
    _check("best", stages, microbatches)
    if overlap is not None and saving is not None:
        raise InvalidArgumentError(
            f"best: overlap is {overlap} and saving is {saving}, expected at most one"
        )
    if max_activations is not None and max_activations <= 0:
        raise InvalidArgumentError(f"best: max_activations is {max_activations}, expected > 0")
    compared, sims = [], {}
    for schedule in candidates(stages, microbatches, max_chunks):
        c = schedule.chunks
        costs = (forward / c, backward / c, None if weight is None else weight / c)
        options: dict[str, float | None] = {
            "comm": comm,
            "overlap": None if overlap is None else overlap / c,
            "saving": None if saving is None else saving / c,
        }
        sim = simulate(schedule, *costs, **options)  # type: ignore[arg-type]
        steady = period(schedule, *costs, **options) if between_steps else None
        peak = max(sim.peak_activations)
        fits = max_activations is None or peak <= max_activations + 1e-9
        compared.append(Candidate(schedule, sim.makespan, sim.bubble_fraction, peak, fits, steady))
        sims[id(schedule)] = sim
    fitting = [c for c in compared if c.fits]
    if not fitting:
        raise InvalidArgumentError(
            f"best: no schedule keeps peak activations within max_activations="
            f"{max_activations}, expected at least {min(c.peak_activations for c in compared):g}"
        )
    pick = min(
        fitting,
        key=lambda c: (round(c.makespan if c.period is None else c.period, 9), c.peak_activations),
    )
    return Choice(pick.schedule, sims[id(pick.schedule)], tuple(compared))


def _check(call: str, stages: int, microbatches: int) -> None:
    if not isinstance(stages, int) or stages < 1:
        raise InvalidArgumentError(f"{call}: stages is {stages!r}, expected an int >= 1")
    if not isinstance(microbatches, int) or microbatches < 1:
        raise InvalidArgumentError(
            f"{call}: microbatches is {microbatches!r}, expected an int >= 1"
        )


__all__ = [
    "Candidate",
    "Choice",
    "best",
    "candidates",
    "dualpipe_v",
    "gpipe",
    "interleaved_1f1b",
    "interleaved_zero_bubble",
    "one_f_one_b",
    "zero_bubble",
    "zero_bubble_h2",
    "zero_bubble_v",
]
