"""validate() catches broken schedules and says why; the communication plan it proves."""

from __future__ import annotations

import pytest

import collectives as col
from pipeline import Schedule, schedules
from pipeline._plan import Group, from_text, plan, to_text
from pipeline.schedules import gpipe, interleaved_1f1b, one_f_one_b, zero_bubble, zero_bubble_h2


def bad(text, **kw):
    return Schedule.from_text(text, **kw)


@pytest.mark.parametrize(
    "text,kw,match",
    [
        ("rank 0: 0F0 0B0 0F1\nrank 1: 0F0 0B0 0F1 0B1", {}, r"rank 0: 0B1 \(stage 0\) is missing"),
        ("rank 0: 0F0 0B0\nrank 1: 0F0 0B0 0B0", {}, r"rank 1: 0B0 \(stage 1\) appears 2 times"),
        ("rank 0: 0B0 0F0\nrank 1: 0F0 0B0", {}, r"rank 0: 0B0 comes before 0F0, which it needs"),
        ("rank 0: 0F0 0W0 0I0\nrank 1: 0F0 0I0 0W0", {}, r"rank 0: 0W0 comes before 0I0"),
        ("rank 0: 0F0 0I0\nrank 1: 0F0 0I0 0W0", {}, r"rank 0: 0W0 \(stage 0\) is missing"),
        ("rank 0: 0F0 0B0 0W0\nrank 1: 0F0 0B0", {}, r"0B0 \(stage 0\) is both whole and split"),
        ("rank 0: 0F0 0B0 0F5\nrank 1: 0F0 0B0", {"microbatches": 1}, r"0F5 is out of range"),
        ("rank 0: 1F0 0F0 0B0 1B0", {}, r"rank 0: 1F0 comes before 0F0"),
        (
            "rank 0: 0F0 0B0 0F1 0B1\nrank 1: 0F1 0B1 0F0 0B0",
            {},
            r"rank 0 waits forever before 0B0 to receive the gradient of stage 1 microbatch 1",
        ),
        ("rank 0: 0F0+0B0", {}, r"rank 0: overlap at position 0 is 0F0 \+ 0B0, expected a forward"),
        ("rank 0: 0F0 0F1 0B0+0B1", {}, r"overlap at position 2 is 0B0 \+ 0B1"),
    ],
)
def test_broken_schedules(text, kw, match):
    schedule = bad(text, **kw)
    with pytest.raises(col.InvalidArgumentError, match=match) as info:
        schedule.validate()
    assert "rank 0 |" in str(info.value)  # the picture comes with the reason


def test_a_reordered_but_possible_schedule_is_valid():
    # rank 1 forwards microbatch 1 first: microbatch 0 is received early, into the mailbox
    Schedule.from_text("rank 0: 0F0 0F1 0B0 0B1\nrank 1: 0F1 0F0 0B0 0B1").validate()


def _ops(schedule):
    """Every op of the plan as (rank, send?, header?, message), to check the pairing."""
    return [
        (rank, op.send, op.header, op.message)
        for rank, row in enumerate(plan(schedule))
        for item in row
        if isinstance(item, Group)
        for op in item.ops
    ]


@pytest.mark.parametrize(
    "schedule",
    [
        gpipe(4, 8),
        one_f_one_b(4, 8),
        interleaved_1f1b(2, 4, 2),
        interleaved_1f1b(4, 8, 3),
        zero_bubble(4, 8),
        zero_bubble_h2(3, 5),
        schedules.zero_bubble_v(4, 8),
        schedules.dualpipe_v(3, 6),
    ],  # fmt: skip
    ids=lambda s: s.name,
)
def test_plan_pairs_every_send_with_one_receive_in_order(schedule):
    ops = _ops(schedule)
    sends = [(m, h) for r, s, h, m in ops if s]
    recvs = [(m, h) for r, s, h, m in ops if not s]
    assert sorted(map(str, sends)) == sorted(map(str, recvs))
    assert len(set(sends)) == len(sends)
    # per (src, dst), the receiver posts in exactly the sender's order (FIFO matching)
    for src in range(schedule.ranks):
        for dst in range(schedule.ranks):
            out = [(m, h) for r, s, h, m in ops if s and r == src and m.dst == dst]
            inc = [(m, h) for r, s, h, m in ops if not s and r == dst and m.src == src]
            assert out == inc
    # one header per (src, dst, kind, stage), before its first payload
    headers = [(m.src, m.dst, m.kind, m.stage) for m, h in sends if h]
    assert len(headers) == len(set(headers))


def test_plan_of_gpipe_on_two_ranks():
    rows = plan(gpipe(2, 1))
    text = [
        str(x) if not isinstance(x, Group) else [(o.send, o.header) for o in x.ops] for x in rows[1]
    ]
    # rank 1: header, then payload of the activation; forward; backward; send the gradient
    assert text == [[(False, True)], [(False, False)], "0F0", "0B0", [(True, True), (True, False)]]


@pytest.mark.parametrize("p,m", [(1, 2), (2, 4), (4, 8), (3, 5)])
def test_plan_text_round_trip(p, m):
    for schedule in [
        gpipe(p, m),
        zero_bubble(p, m),
        schedules.zero_bubble_v(p, m),
        schedules.dualpipe_v(p, m),
    ]:
        rows = plan(schedule)
        text = to_text(rows)
        assert from_text(text) == rows
        assert text.count("[") == sum(isinstance(x, Group) for row in rows for x in row)


def test_plan_text_errors():
    with pytest.raises(col.InvalidArgumentError, match="Op.parse: text is '>1:foo0.0'"):
        from_text("rank 0: 0F0 [>1:foo0.0]")
    with pytest.raises(col.InvalidArgumentError, match="line 1 is 'rank 1: 0F0'"):
        from_text("rank 1: 0F0")
