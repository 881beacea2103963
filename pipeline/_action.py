"""The action format: an action (chunk, kind, microbatch), its text form, and text grids of
per-rank action lists (the pictures that error messages carry)."""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from collectives import InvalidArgumentError

if TYPE_CHECKING:
    from ._schedule import Schedule


class ActionKind(enum.Enum):
    """What an action computes; ``name`` is its letter in the text form."""

    F = "forward"
    B = "backward"  # input and weight gradients together
    I = "input-gradient half"  # noqa: E741 - the letter of the zero-bubble papers
    W = "weight-gradient half"


_TEXT = re.compile(r"^(\d+)([FBIW])(\d+)$")


@dataclass(frozen=True, order=True)
class Action:
    """One unit of work on one rank: ``kind`` of ``microbatch`` through local ``chunk``.

    The text form is ``<chunk><kind><microbatch>``::

        >>> str(Action(0, ActionKind.F, 3))
        '0F3'
        >>> Action.parse("1W2")
        Action(chunk=1, kind=<ActionKind.W: 'weight-gradient half'>, microbatch=2)
    """

    chunk: int
    kind: ActionKind
    microbatch: int

    def __str__(self) -> str:
        return f"{self.chunk}{self.kind.name}{self.microbatch}"

    @classmethod
    def parse(cls, text: str) -> Action:
        """The action written as ``text`` (e.g. ``"0F3"``), the inverse of ``str``."""
        found = _TEXT.match(text.strip())
        if found is None:
            raise InvalidArgumentError(
                f"Action.parse: text is {text!r}, expected <chunk><F|B|I|W><microbatch> like '0F3'"
            )
        chunk, kind, microbatch = found.groups()
        return cls(int(chunk), ActionKind[kind], int(microbatch))

    def stage(self, rank: int, ranks: int) -> int:
        """The model stage of this action in a looped placement (chunk c of rank r is stage
        ``c * ranks + r``); ``Schedule.stage_of`` answers for any placement."""
        return self.chunk * ranks + rank


F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W  # noqa: E741


def cell(schedule: Schedule, rank: int, index: int) -> str:
    """The text of action ``index`` of ``rank``, with ``+`` where it overlaps the next one."""
    text = str(schedule.actions[rank][index])
    return text + "+" if (rank, index) in schedule.overlaps else text


def grid(
    schedule: Schedule,
    timeline: Sequence[Sequence[Any]] | None = None,
    unit: float | None = None,
    *,
    mark: tuple[int, int] | None = None,
) -> str:
    """Text picture of a schedule: ranks x position, or ranks x time given a ``timeline``
    (per rank, events with ``action``, ``start`` and ``end``). ``mark=(rank, index)`` puts
    ``>`` before that action in the position picture.

    >>> from pipeline.schedules import gpipe
    >>> print(grid(gpipe(2, 2)))
    rank 0 | 0F0 0F1 0B0 0B1
    rank 1 | 0F0 0F1 0B0 0B1
    """
    rows = [
        [cell(schedule, r, i) for i in range(len(acts))] for r, acts in enumerate(schedule.actions)
    ]
    width = max([len(text) for row in rows for text in row] + [3])
    label = len(f"rank {schedule.ranks - 1}")
    if timeline is None:
        lines = []
        for r, row in enumerate(rows):
            texts = [f"{text:<{width}}" for text in row]
            if mark is not None and mark[0] == r and mark[1] < len(texts):
                texts[mark[1]] = ">" + texts[mark[1]]
            lines.append((f"{'rank ' + str(r):<{label}} | " + " ".join(texts)).rstrip())
        return "\n".join(lines)
    durations = [e.end - e.start for row in timeline for e in row if e.end > e.start]
    step = unit or (min(durations) if durations else 1.0)
    end = max((e.end for row in timeline for e in row), default=0.0)
    cells = int(round(end / step))
    lines = []
    for r, events in enumerate(timeline):
        line = [" " * (width - 1) + "."] * cells
        for e in events:
            first, stop = int(round(e.start / step)), int(round(e.end / step))
            for k in range(first, max(stop, first + 1)):
                if k < cells:
                    line[k] = f"{str(e.action):>{width}}"
        lines.append(f"{'rank ' + str(r):<{label}} | " + " ".join(line))
    return "\n".join(lines)
