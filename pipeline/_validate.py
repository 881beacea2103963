"""Check a schedule before running it: complete, ordered, and free of deadlock."""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from collectives import InvalidArgumentError

from ._action import B, F, I, W
from ._plan import Group, PlanError, plan

if TYPE_CHECKING:  # the schedule imports the validator, not the other way round
    from ._schedule import Schedule


def validate(schedule: Schedule) -> None:
    """Raise ``InvalidArgumentError`` (with a picture of the schedule) unless it can run.

    1. every action names an existing chunk and microbatch;
    2. every (stage, microbatch) has one forward and either one backward (B) or one
       input-gradient half (I) and one weight-gradient half (W), on the rank that holds it;
    3. on each rank, a forward comes before its backward, an I before its W, and where two
       neighbouring stages share a rank, the upstream forward (downstream backward) first;
    4. every message sent is received, and playing the runtime's batched sends and receives
       out with blocking semantics (a group completes only when all its peers have posted
       the matching ops), every rank reaches its end.

        >>> from pipeline.schedules import one_f_one_b
        >>> validate(one_f_one_b(4, 8))
    """
    problems = _contents(schedule) or _order(schedule)
    if not problems:
        try:
            rows = plan(schedule)
        except PlanError as error:
            problems = str(error).split("\n  ")
        else:
            problems = _deadlock(schedule, rows)
    if problems:
        shown = "\n  ".join(problems[:8]) + (
            f"\n  ... {len(problems) - 8} more" if len(problems) > 8 else ""
        )
        raise InvalidArgumentError(
            f"validate: schedule {schedule.name!r} cannot run:\n  {shown}\n{schedule.grid()}"
        )


def _contents(schedule: Schedule) -> list[str]:
    problems: list[str] = []
    counts: Counter = Counter()
    for rank, acts in enumerate(schedule.actions):
        for a in acts:
            if not 0 <= a.chunk < schedule.chunks or not 0 <= a.microbatch < schedule.microbatches:
                problems.append(
                    f"rank {rank}: {a} is out of range, expected chunk < {schedule.chunks} "
                    f"and microbatch < {schedule.microbatches}"
                )
            if 0 <= a.chunk < schedule.chunks:
                counts[(schedule.stage_of(rank, a.chunk), a.kind, a.microbatch)] += 1
    for key, n in counts.items():
        if n > 1:
            problems.append(
                f"rank {_rank(schedule, key[0])}: {_name(schedule, *key)} appears {n} times"
            )
    for stage in range(schedule.stages):
        for m in range(schedule.microbatches):
            has = {k: counts[(stage, k, m)] for k in (F, B, I, W)}
            missing = []
            if not has[F]:
                missing.append(F)
            if not has[B] and not has[I]:
                missing.append(B)
            if has[I] and not has[W]:
                missing.append(W)
            if has[W] and not has[I]:
                missing.append(I)
            if has[B] and (has[I] or has[W]):
                problems.append(
                    f"rank {_rank(schedule, stage)}: {_name(schedule, stage, B, m)} is both whole and split"
                )
            problems += [
                f"rank {_rank(schedule, stage)}: {_name(schedule, stage, k, m)} is missing"
                for k in missing
            ]
    for rank, index in sorted(schedule.overlaps):
        acts = schedule.actions[rank] if 0 <= rank < schedule.ranks else ()
        pair = acts[index : index + 2] if 0 <= index else ()
        if (
            len(pair) != 2
            or {a.kind is F for a in pair} != {True, False}
            or W in {a.kind for a in pair}
            or pair[0].microbatch == pair[1].microbatch
        ):
            problems.append(
                f"rank {rank}: overlap at position {index} is {' + '.join(map(str, pair)) or 'nothing'}, "
                "expected a forward and a backward (B or I) of different microbatches"
            )
    return problems


def _order(schedule: Schedule) -> list[str]:
    problems = []
    for rank, acts in enumerate(schedule.actions):
        at = {
            (schedule.stage_of(rank, a.chunk), a.kind, a.microbatch): i for i, a in enumerate(acts)
        }
        for (stage, kind, m), i in at.items():
            before = []
            if kind in (B, I):
                before.append((stage, F, m))
                if stage + 1 < schedule.stages and schedule.place(stage + 1)[0] == rank:
                    before += [(stage + 1, B, m), (stage + 1, I, m)]
            if kind is W:
                before.append((stage, I, m))
            if kind is F and stage > 0 and schedule.place(stage - 1)[0] == rank:
                before.append((stage - 1, F, m))
            for key in before:
                if key in at and at[key] > i:
                    problems.append(
                        f"rank {rank}: {acts[i]} comes before {acts[at[key]]}, which it needs"
                    )
    return problems


def _deadlock(schedule: Schedule, rows) -> list[str]:
    """Play out the plan: a group completes once each peer has posted the matching op."""
    where = {}  # (send?, message, header?) -> (rank, item index)
    for rank, row in enumerate(rows):
        for index, item in enumerate(row):
            if isinstance(item, Group):
                for op in item.ops:
                    where[(op.send, op.message, op.header)] = (rank, index)
    problems = []
    for (send, message, header), (rank, _) in where.items():
        if send and (False, message, header) not in where:
            problems.append(
                f"rank {rank} sends the {message} but rank {message.dst} never receives it"
            )
    if problems:
        return problems
    at = [0] * len(rows)
    moved = True
    while moved:
        moved = False
        for rank, row in enumerate(rows):
            while at[rank] < len(row):
                item = row[at[rank]]
                if isinstance(item, Group) and not all(
                    at[peer] >= index
                    for op in item.ops
                    for peer, index in [where[(not op.send, op.message, op.header)]]
                ):
                    break
                at[rank] += 1
                moved = True
    for rank, row in enumerate(rows):
        if at[rank] < len(row):
            group = row[at[rank]]
            upcoming = next((x for x in row[at[rank] :] if not isinstance(x, Group)), None)
            waits = [
                f"{'send' if op.send else 'receive'} the {op.message}{' header' if op.header else ''}"
                for op in group.ops
                if at[op.peer] < where[(not op.send, op.message, op.header)][1]
            ]
            problems.append(
                f"rank {rank} waits forever before {upcoming or 'its end'} to " + "; ".join(waits)
            )
    return problems


def _name(schedule: Schedule, stage: int, kind, m: int) -> str:
    return f"{schedule.place(stage)[1]}{kind.name}{m} (stage {stage})"


def _rank(schedule: Schedule, stage: int) -> int:
    return schedule.place(stage)[0]
