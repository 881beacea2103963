"""The communication plan of a schedule: which sends and receives each rank batches when.

Pure functions of the schedule, shared by the runtime (which executes the plan) and the
validator (which plays it out with blocking semantics to prove it cannot deadlock).

A rank's plan is a list of items, each either an :class:`Action` to compute or a
:class:`Group` of point-to-point ops posted together (``with comm.group():``) that
completes only once every op in it has met its peer's matching op. The rules:

- the outputs of an action are sent in the group right before the rank's next action,
  together with the receive that next action needs, so that neighbours exchanging in
  opposite directions meet in one group instead of waiting on each other;
- messages from one peer are received in the order that peer sends them (both sides know
  the whole schedule), so the k-th send always meets the k-th receive even where
  activations and gradients share a direction (interleaved schedules on two ranks); a
  message that arrives before it is needed waits in a mailbox;
- the first message of each kind (activation or gradient of a stage) between two ranks is
  preceded by a header with its shape and dtype; its payload is received in a later group
  of the receiver, once the header told it what buffer to allocate.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from collectives import InvalidArgumentError

from ._action import Action, B, F, I

if TYPE_CHECKING:  # the schedule imports the validator, not the other way round
    from ._schedule import Schedule


_OP = re.compile(r"^([<>])(\d+):(act|grad)(\d+)\.(\d+)(h?)$")


@dataclass(frozen=True)
class Message:
    """An activation (``"act"``) or gradient (``"grad"``) of ``stage`` for ``microbatch``."""

    kind: str
    stage: int
    microbatch: int
    src: int
    dst: int

    def __str__(self) -> str:
        what = "activation" if self.kind == "act" else "gradient"
        return f"{what} of stage {self.stage} microbatch {self.microbatch} ({self.src}->{self.dst})"


@dataclass(frozen=True)
class Op:
    """One half of a transfer: this rank sends (``send``) or receives ``message``."""

    send: bool
    message: Message
    header: bool  # the small shape/dtype header that precedes a first message

    @property
    def peer(self) -> int:
        return self.message.dst if self.send else self.message.src

    def __str__(self) -> str:
        """``>1:act0.3`` sends to rank 1 the activation of stage 0 for microbatch 3;
        ``<2:grad5.0h`` receives from rank 2 the header of a gradient; see :func:`to_text`."""
        m = self.message
        arrow = ">" if self.send else "<"
        return f"{arrow}{self.peer}:{m.kind}{m.stage}.{m.microbatch}{'h' if self.header else ''}"

    @classmethod
    def parse(cls, text: str, rank: int) -> Op:
        """The op of ``rank`` written as ``text`` (the inverse of ``str``)."""
        found = _OP.match(text)
        if found is None:
            raise InvalidArgumentError(
                f"Op.parse: text is {text!r}, expected <'>'|'<'><peer>:<act|grad><stage>.<microbatch>[h] like '>1:act0.3'"
            )
        arrow, peer, kind, stage, microbatch, header = found.groups()
        send = arrow == ">"
        src, dst = (rank, int(peer)) if send else (int(peer), rank)
        return cls(send, Message(kind, int(stage), int(microbatch), src, dst), header == "h")


@dataclass(frozen=True)
class Group:
    """Ops posted together; the group completes when all of them have met their peers."""

    ops: tuple[Op, ...]


def outputs(schedule: Schedule, rank: int, action: Action) -> list[Message]:
    """Messages ``action`` on ``rank`` produces for other ranks (none for local handoffs)."""
    stage, m = schedule.stage_of(rank, action.chunk), action.microbatch
    if action.kind is F and stage < schedule.stages - 1:
        peer = schedule.place(stage + 1)[0]
        return [Message("act", stage, m, rank, peer)] if peer != rank else []
    if action.kind in (B, I) and stage > 0:
        peer = schedule.place(stage - 1)[0]
        return [Message("grad", stage, m, rank, peer)] if peer != rank else []
    return []


def needs(schedule: Schedule, rank: int, action: Action) -> Message | None:
    """The message ``action`` on ``rank`` must receive before it can run, if any."""
    stage, m = schedule.stage_of(rank, action.chunk), action.microbatch
    if action.kind is F and stage > 0:
        peer = schedule.place(stage - 1)[0]
        return Message("act", stage - 1, m, peer, rank) if peer != rank else None
    if action.kind in (B, I) and stage < schedule.stages - 1:
        peer = schedule.place(stage + 1)[0]
        return Message("grad", stage + 1, m, peer, rank) if peer != rank else None
    return None


def streams(schedule: Schedule) -> dict[tuple[int, int], list[Message]]:
    """``(src, dst) -> messages`` in the order ``src`` sends them."""
    out: dict[tuple[int, int], list[Message]] = {}
    for rank, acts in enumerate(schedule.actions):
        for action in acts:
            for msg in outputs(schedule, rank, action):
                out.setdefault((msg.src, msg.dst), []).append(msg)
    return out


def headed(schedule: Schedule) -> frozenset[Message]:
    """The messages that carry a header: the first of each (src, dst, kind, stage)."""
    seen, out = set(), set()
    for stream in streams(schedule).values():
        for msg in stream:
            key = (msg.src, msg.dst, msg.kind, msg.stage)
            if key not in seen:
                seen.add(key)
                out.add(msg)
    return frozenset(out)


Plan = tuple[tuple[Action | Group, ...], ...]


def to_text(rows: Plan) -> str:
    """One line per rank: actions as in schedules, each group of ops in brackets.

    >>> from pipeline.schedules import gpipe
    >>> print(to_text(plan(gpipe(2, 1))))
    rank 0: 0F0 [>1:act0.0h >1:act0.0 <1:grad1.0h] [<1:grad1.0] 0B0
    rank 1: [<0:act0.0h] [<0:act0.0] 0F0 0B0 [>0:grad1.0h >0:grad1.0]
    """
    lines = []
    for rank, row in enumerate(rows):
        words = [
            "[" + " ".join(map(str, x.ops)) + "]" if isinstance(x, Group) else str(x) for x in row
        ]
        lines.append(f"rank {rank}: " + " ".join(words))
    return "\n".join(lines)


def from_text(text: str) -> Plan:
    """The plan written by :func:`to_text`."""
    rows = []
    for number, line in enumerate(text.strip().splitlines()):
        head, _, body = line.partition(":")
        if head.strip() != f"rank {number}":
            raise InvalidArgumentError(
                f"plan from_text: line {number + 1} is {line!r}, expected 'rank {number}: ...'"
            )
        row: list[Action | Group] = []
        for word in re.findall(r"\[[^\]]*\]|\S+", body):
            if word.startswith("["):
                row.append(Group(tuple(Op.parse(w, number) for w in word[1:-1].split())))
            else:
                row.append(Action.parse(word))
        rows.append(tuple(row))
    return tuple(rows)


class PlanError(Exception):
    """The schedule's data flow cannot complete (the validator words it)."""


def plan(schedule: Schedule) -> Plan:
    """Per rank, the actions with the groups of sends and receives between them.

        >>> from pipeline.schedules import gpipe
        >>> [str(x) if isinstance(x, Action) else len(x.ops) for x in plan(gpipe(2, 1))[0]]
        ['0F0', 3, 1, '0B0']

    (Rank 0 sends the activation's header and payload and asks for the gradient's header
    in one group, then receives the gradient's payload in the next.)
    """
    return _plan(schedule)


@lru_cache(maxsize=64)
def _plan(schedule: Schedule) -> tuple[tuple[Action | Group, ...], ...]:
    return _Builder(schedule).run()


class _Builder:
    """Builds the plan by playing it out under blocking semantics.

    Each rank computes its actions in order. Before an action it posts a group with the
    sends still owed from its previous action and the receive this action needs (with the
    earlier messages of that peer's stream); a group completes once every op in it has met
    its peer's op. When every rank is stuck, each send that no one is receiving yet gets its
    receive added to the receiver's open group: receiving early is harmless (the message
    waits in a mailbox) and it breaks the cycle. Only a data flow that truly cannot
    complete is left stuck, and that raises :class:`PlanError`.
    """

    def __init__(self, schedule: Schedule):
        self.schedule = schedule
        self.streams = streams(schedule)
        self.first = headed(schedule)
        p = schedule.ranks
        self.rows: list[list[Action | Group | list[Op]]] = [[] for _ in range(p)]
        self.position = [0] * p  # next action
        self.open: list[list[Op] | None] = [None] * p  # the posted, incomplete group
        self.owed: list[list[Message]] = [[] for _ in range(p)]  # sends not yet posted
        self.later: list[list[Op]] = [[] for _ in range(p)]  # receives for the next group
        self.claimed = [dict.fromkeys(range(p), 0) for _ in range(p)]  # per src, in stream order
        self.posted: dict[tuple[bool, Message, bool], int] = {}  # op key -> rank
        self.done = [False] * p

    def run(self) -> tuple[tuple[Action | Group, ...], ...]:
        while not all(self.done):
            moved = False
            for rank in range(self.schedule.ranks):
                moved |= self._advance(rank)
            if not moved and not self._receive_early():
                raise PlanError(self._stuck())
        return tuple(
            tuple(Group(tuple(x)) if isinstance(x, list) else x for x in row) for row in self.rows
        )

    def _advance(self, rank: int) -> bool:
        moved = False
        acts = self.schedule.actions[rank]
        while not self.done[rank]:
            group = self.open[rank]
            if group is not None:
                if not all((not op.send, op.message, op.header) in self.posted for op in group):
                    return moved
                self.open[rank] = None
                moved = True
                continue
            if self.later[rank]:
                ops, self.later[rank] = self.later[rank], []
                self._post(rank, self._split(rank, ops))
                continue
            if self.position[rank] == len(acts):
                leftovers = [
                    Op(False, msg, False)
                    for (src, dst), stream in self.streams.items()
                    if dst == rank
                    for msg in stream[self.claimed[rank][src] :]
                ]
                for op in leftovers:
                    self.claimed[rank][op.message.src] += 1
                if self.owed[rank] or leftovers:
                    self._post(rank, self._sends(rank) + self._split(rank, leftovers))
                    continue
                self.done[rank] = True
                return True
            action = acts[self.position[rank]]
            need = needs(self.schedule, rank, action)
            if need is not None:
                stream = self.streams.get((need.src, rank), [])
                if need not in stream:
                    raise PlanError(
                        f"rank {rank} at {action} needs the {need}, which is never sent"
                    )
                at = stream.index(need)
                if at >= self.claimed[rank][need.src]:
                    recvs = [
                        Op(False, m, False) for m in stream[self.claimed[rank][need.src] : at + 1]
                    ]
                    self.claimed[rank][need.src] = at + 1
                    self._post(rank, self._sends(rank) + self._split(rank, recvs))
                    continue
            if self.owed[rank]:
                self._post(rank, self._sends(rank))
                continue
            self.rows[rank].append(action)
            self.position[rank] += 1
            self.owed[rank] = outputs(self.schedule, rank, action)
            moved = True
        return moved

    def _sends(self, rank: int) -> list[Op]:
        ops = []
        for msg in self.owed[rank]:
            if msg in self.first:
                ops.append(Op(True, msg, True))
            ops.append(Op(True, msg, False))
        self.owed[rank] = []
        return ops

    def _split(self, rank: int, recvs: list[Op]) -> list[Op]:
        """Receives up to the first header; the rest wait for the next group."""
        now = []
        for i, op in enumerate(recvs):
            if (
                op.message in self.first
                and not op.header
                and (False, op.message, True) not in self.posted
            ):
                now.append(Op(False, op.message, True))
                self.later[rank] = recvs[i:] + self.later[rank]
                return now
            now.append(op)
        return now

    def _post(self, rank: int, ops: list[Op]) -> None:
        self.rows[rank].append(ops)
        self.open[rank] = ops
        for op in ops:
            self.posted[(op.send, op.message, op.header)] = rank

    def _receive_early(self) -> bool:
        added = False
        for rank in range(self.schedule.ranks):
            for op in self.open[rank] or []:
                msg = op.message
                if not op.send or (False, msg, op.header) in self.posted:
                    continue
                dst, group = msg.dst, self.open[msg.dst]
                stream = self.streams[(rank, dst)]
                at = stream.index(msg)
                if group is None or at < self.claimed[dst][rank]:
                    continue  # claimed already: it waits in the receiver's next group
                recvs = [Op(False, m, False) for m in stream[self.claimed[dst][rank] : at + 1]]
                self.claimed[dst][rank] = at + 1
                for new in self._split(dst, recvs):
                    group.append(new)
                    self.posted[(False, new.message, new.header)] = dst
                added = True
        return added

    def _stuck(self) -> str:
        lines = []
        for rank, acts in enumerate(self.schedule.actions):
            if self.done[rank]:
                continue
            at = acts[self.position[rank]] if self.position[rank] < len(acts) else "its end"
            waits = [
                f"{'send' if op.send else 'receive'} the {op.message}"
                for op in self.open[rank] or []
                if (not op.send, op.message, op.header) not in self.posted
            ]
            lines.append(f"rank {rank} waits forever before {at} to " + "; ".join(waits))
        return "\n  ".join(lines)
