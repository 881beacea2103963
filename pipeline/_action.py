"""Schedules as data: an action (chunk, kind, microbatch) and per-rank lists of them."""

from __future__ import annotations

import enum
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from collectives import InvalidArgumentError


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
        """The model stage this action runs: chunk c of rank r is stage ``c * ranks + r``."""
        return self.chunk * ranks + rank


F, B, I, W = ActionKind.F, ActionKind.B, ActionKind.I, ActionKind.W  # noqa: E741


@dataclass(frozen=True)
class Schedule:
    """Per-rank action lists of one pipeline step: ``actions[rank]`` in execution order.

    ``ranks`` pipeline ranks each hold ``chunks`` model chunks (chunk c of rank r is model
    stage ``c * ranks + r``); ``microbatches`` flow through all ``ranks * chunks`` stages.

        >>> s = Schedule.from_text("rank 0: 0F0 0B0\\nrank 1: 0F0 0B0", microbatches=1)
        >>> [str(a) for a in s.actions[1]]
        ['0F0', '0B0']
    """

    ranks: int
    microbatches: int
    chunks: int
    actions: tuple[tuple[Action, ...], ...]
    name: str = field(default="schedule", compare=False)

    def __post_init__(self) -> None:
        if len(self.actions) != self.ranks:
            raise InvalidArgumentError(
                f"Schedule: actions has {len(self.actions)} rank lists, expected ranks={self.ranks}"
            )

    @property
    def stages(self) -> int:
        """Model stages in all: ``ranks * chunks``."""
        return self.ranks * self.chunks

    @property
    def splits_backward(self) -> bool:
        """Whether backward runs as separate input-gradient (I) and weight-gradient (W) halves."""
        return any(a.kind in (I, W) for rank in self.actions for a in rank)

    def rank_of(self, stage: int) -> int:
        """The rank that holds model ``stage``."""
        return stage % self.ranks

    def chunk_of(self, stage: int) -> int:
        """The local chunk index of model ``stage`` on its rank."""
        return stage // self.ranks

    def validate(self) -> Schedule:
        """Raise ``InvalidArgumentError`` unless this schedule can run; returns ``self``.

        Checks that every (stage, microbatch) has its forward and backward exactly once, in
        an order that respects the data flow, and that the runtime's batched sends and
        receives match up without any rank waiting forever.
        """
        from ._validate import validate

        validate(self)
        return self

    def to_text(self) -> str:
        """One line per rank, ``rank r: 0F0 0F1 ...``; :meth:`from_text` reads it back."""
        return "\n".join(
            f"rank {r}: " + " ".join(str(a) for a in acts) for r, acts in enumerate(self.actions)
        )

    @classmethod
    def from_text(
        cls,
        text: str,
        *,
        microbatches: int | None = None,
        chunks: int | None = None,
        name: str = "schedule",
    ) -> Schedule:
        """The schedule written by :meth:`to_text` (lines ``rank r: <actions>``).

        ``microbatches`` and ``chunks`` default to one more than the largest seen.
        """
        rows: dict[int, list[Action]] = {}
        for number, line in enumerate(text.strip().splitlines(), 1):
            head, sep, body = line.partition(":")
            words = head.split()
            if not sep or len(words) != 2 or words[0] != "rank" or not words[1].isdigit():
                raise InvalidArgumentError(
                    f"Schedule.from_text: line {number} is {line!r}, expected 'rank <r>: <actions>'"
                )
            rows[int(words[1])] = [Action.parse(w) for w in body.split()]
        if sorted(rows) != list(range(len(rows))):
            raise InvalidArgumentError(
                f"Schedule.from_text: ranks are {sorted(rows)}, expected 0..{len(rows) - 1}"
            )
        every = [a for acts in rows.values() for a in acts]
        if microbatches is None:
            microbatches = 1 + max((a.microbatch for a in every), default=-1)
        if chunks is None:
            chunks = 1 + max((a.chunk for a in every), default=0)
        return cls(
            len(rows), microbatches, chunks, _freeze(rows[r] for r in range(len(rows))), name
        )

    def grid(self) -> str:
        """A ranks x position text table of the actions, for error messages."""
        from ._simulate import grid

        return grid(self)

    def __str__(self) -> str:
        return f"{self.name} ({self.ranks} ranks, {self.microbatches} microbatches, {self.chunks} chunks)\n{self.grid()}"


def _freeze(rows: Iterable[Sequence[Action]]) -> tuple[tuple[Action, ...], ...]:
    return tuple(tuple(r) for r in rows)
