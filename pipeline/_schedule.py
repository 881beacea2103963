"""A schedule: per-rank action lists, where each chunk lives, and which actions overlap."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from collectives import InvalidArgumentError

from ._action import Action, I, W, grid
from ._validate import validate

#: how chunks map to model stages: ``looped`` (chunk c of rank r is stage ``c * ranks + r``)
#: or ``v`` (two chunks; rank r holds stages r and ``2 * ranks - 1 - r``)
LAYOUTS = ("looped", "v")


@dataclass(frozen=True)
class Schedule:
    """Per-rank action lists of one pipeline step: ``actions[rank]`` in execution order.

    ``ranks`` pipeline ranks each hold ``chunks`` model chunks; :meth:`stage_of` says which
    model stage each chunk is (``layout``: ``"looped"`` or ``"v"``, see ``LAYOUTS``);
    ``microbatches`` flow through all ``ranks * chunks`` stages. ``overlaps`` holds the
    ``(rank, index)`` of actions that run together with the next action of their rank (a
    forward and a backward of different microbatches; ``+`` in the text form).

        >>> s = Schedule.from_text("rank 0: 0F0 0B0\\nrank 1: 0F0 0B0", microbatches=1)
        >>> [str(a) for a in s.actions[1]]
        ['0F0', '0B0']
    """

    ranks: int
    microbatches: int
    chunks: int
    actions: tuple[tuple[Action, ...], ...]
    name: str = field(default="schedule", compare=False)
    layout: str = "looped"
    overlaps: frozenset[tuple[int, int]] = frozenset()

    def __post_init__(self) -> None:
        if len(self.actions) != self.ranks:
            raise InvalidArgumentError(
                f"Schedule: actions has {len(self.actions)} rank lists, expected ranks={self.ranks}"
            )
        if self.layout not in LAYOUTS:
            raise InvalidArgumentError(
                f"Schedule: layout is {self.layout!r}, expected one of {', '.join(LAYOUTS)}"
            )
        if self.layout == "v" and self.chunks != 2:
            raise InvalidArgumentError(
                f"Schedule: layout 'v' has chunks={self.chunks}, expected 2 (down and back up)"
            )

    @property
    def stages(self) -> int:
        """Model stages in all: ``ranks * chunks``."""
        return self.ranks * self.chunks

    @property
    def splits_backward(self) -> bool:
        """Whether backward runs as separate input-gradient (I) and weight-gradient (W) halves."""
        return any(a.kind in (I, W) for rank in self.actions for a in rank)

    def stage_of(self, rank: int, chunk: int) -> int:
        """The model stage that local ``chunk`` of ``rank`` holds.

        >>> from pipeline.schedules import zero_bubble_v
        >>> s = zero_bubble_v(4, 8)
        >>> [s.stage_of(0, 0), s.stage_of(0, 1), s.stage_of(3, 1)]
        [0, 7, 4]
        """
        if self.layout == "v" and chunk == 1:
            return 2 * self.ranks - 1 - rank
        return chunk * self.ranks + rank

    def place(self, stage: int) -> tuple[int, int]:
        """``(rank, chunk)`` that holds model ``stage``: the inverse of :meth:`stage_of`."""
        return self._places[stage]

    @cached_property
    def _places(self) -> dict[int, tuple[int, int]]:
        return {self.stage_of(r, c): (r, c) for r in range(self.ranks) for c in range(self.chunks)}

    def validate(self) -> Schedule:
        """Raise ``InvalidArgumentError`` unless this schedule can run; returns ``self``.

        Checks that every (stage, microbatch) has its forward and backward exactly once, in
        an order that respects the data flow, and that the runtime's batched sends and
        receives match up without any rank waiting forever.
        """
        validate(self)
        return self

    def to_text(self) -> str:
        """One line per rank, ``rank r: 0F0 0F1 ...``; :meth:`from_text` reads it back.
        Overlapped actions are joined by ``+`` (``0F3+1I1``)."""
        lines = []
        for r, acts in enumerate(self.actions):
            words = "".join(
                str(a) + ("+" if (r, i) in self.overlaps else " ") for i, a in enumerate(acts)
            )
            lines.append(f"rank {r}: {words}".rstrip())
        return "\n".join(lines)

    @classmethod
    def from_text(
        cls,
        text: str,
        *,
        microbatches: int | None = None,
        chunks: int | None = None,
        name: str = "schedule",
        layout: str = "looped",
    ) -> Schedule:
        """The schedule written by :meth:`to_text` (lines ``rank r: <actions>``).

        ``microbatches`` and ``chunks`` default to one more than the largest seen.
        """
        rows: dict[int, list[Action]] = {}
        overlaps: set[tuple[int, int]] = set()
        for number, line in enumerate(text.strip().splitlines(), 1):
            head, sep, body = line.partition(":")
            words = head.split()
            if not sep or len(words) != 2 or words[0] != "rank" or not words[1].isdigit():
                raise InvalidArgumentError(
                    f"Schedule.from_text: line {number} is {line!r}, expected 'rank <r>: <actions>'"
                )
            rank, row = int(words[1]), list[Action]()
            for word in body.split():
                parts = word.split("+")
                for k, part in enumerate(parts):
                    if k < len(parts) - 1:
                        overlaps.add((rank, len(row)))
                    row.append(Action.parse(part))
            rows[rank] = row
        if sorted(rows) != list(range(len(rows))):
            raise InvalidArgumentError(
                f"Schedule.from_text: ranks are {sorted(rows)}, expected 0..{len(rows) - 1}"
            )
        every = [a for acts in rows.values() for a in acts]
        if microbatches is None:
            microbatches = 1 + max((a.microbatch for a in every), default=-1)
        if chunks is None:
            chunks = 1 + max((a.chunk for a in every), default=0)
        actions = _freeze(rows[r] for r in range(len(rows)))
        return cls(len(rows), microbatches, chunks, actions, name, layout, frozenset(overlaps))

    def grid(self) -> str:
        """A ranks x position text table of the actions, for error messages."""
        return grid(self)

    def __str__(self) -> str:
        where = "; ".join(
            f"rank {r}: " + ",".join(str(self.stage_of(r, c)) for c in range(self.chunks))
            for r in range(self.ranks)
        )
        return (
            f"{self.name} ({self.ranks} ranks, {self.microbatches} microbatches, "
            f"{self.chunks} chunks; model stages {where})\n{self.grid()}"
        )


def _freeze(rows: Iterable[Sequence[Action]]) -> tuple[tuple[Action, ...], ...]:
    return tuple(tuple(r) for r in rows)
