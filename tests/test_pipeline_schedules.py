"""Schedule generators: every action once, valid order, memory bounds, text round trip."""

from __future__ import annotations

import pytest

import collectives as col
from pipeline import Action, ActionKind, Schedule, schedules, simulate
from pipeline.schedules import (
    gpipe,
    interleaved_1f1b,
    interleaved_zero_bubble,
    one_f_one_b,
    zero_bubble,
    zero_bubble_h2,
)

pytestmark = pytest.mark.mpi_independent  # schedules built and checked here: no MPI job

CASES = [(p, m) for p in (1, 2, 3, 4, 6, 8) for m in (1, 2, 3, 4, 5, 8, 12, 16)]


def all_schedules(p, m):
    out = [gpipe(p, m), one_f_one_b(p, m), zero_bubble(p, m), zero_bubble_h2(p, m)]
    out += [schedules.zero_bubble_v(p, m, order=o) for o in ("paper", "greedy")]
    out += [schedules.dualpipe_v(p, m, order="greedy")]
    if m >= 2 * p:
        out.append(schedules.dualpipe_v(p, m, order="paper"))
    if max(1, m // p) == 1 or m % (m // p) == 0:
        out += [interleaved_1f1b(p, m, c) for c in (1, 2, 3, 4)]
        out += [interleaved_zero_bubble(p, m, c) for c in (1, 2, 3)]
    return out


def peak_alive(row):
    """Most microbatches alive at once: from a forward to the end of its backward (B or W)."""
    alive, peak = set(), 0
    for a in row:
        if a.kind is ActionKind.F:
            alive.add((a.chunk, a.microbatch))
            peak = max(peak, len(alive))
        elif a.kind in (ActionKind.B, ActionKind.W):
            alive.discard((a.chunk, a.microbatch))
    return peak


@pytest.mark.parametrize("p,m", CASES)
def test_every_action_once_and_valid(p, m):
    for schedule in all_schedules(p, m):
        for row in schedule.actions:
            seen = sorted((a.chunk, a.microbatch, a.kind.name) for a in row)
            whole = {(c, mb) for c, mb, k in seen if k == "B"}  # DualPipeV mixes B with I + W
            want = sorted(
                (c, mb, k)
                for c in range(schedule.chunks)
                for mb in range(m)
                for k in ("FB" if (c, mb) in whole else "FIW")
            )
            assert seen == want, schedule.name
        schedule.validate()


@pytest.mark.parametrize("p,m", CASES)
def test_peak_memory(p, m):
    for r, row in enumerate(one_f_one_b(p, m).actions):
        assert peak_alive(row) == min(p - r, m)
    assert max(peak_alive(row) for row in zero_bubble(p, m).actions) <= p
    assert max(peak_alive(row) for row in zero_bubble_h2(p, m).actions) <= 2 * p - 1
    assert all(peak_alive(row) == m for row in gpipe(p, m).actions)
    if m % p == 0:  # Megatron's warm-up: 2(p-1-r) + (chunks-1)p forwards, then 1F1B
        for r, row in enumerate(interleaved_1f1b(p, m, 2).actions):
            assert peak_alive(row) == min(2 * (p - 1 - r) + p + 1, 2 * m)
        for row in interleaved_zero_bubble(p, m, 2).actions:  # 1F1B's peak
            assert peak_alive(row) == min(2 * p, 2 * m)


def test_interleaved_chunk_order_is_megatrons():
    s = interleaved_1f1b(2, 4, 2)
    assert [str(a) for a in s.actions[0]][:8] == [
        "0F0",
        "0F1",
        "1F0",
        "1F1",
        "0F2",
        "1B0",
        "0F3",
        "1B1",
    ]
    assert s.chunks == 2 and s.stages == 4


def test_text_round_trip():
    for p, m in [(1, 3), (2, 4), (4, 8), (3, 6)]:
        for schedule in all_schedules(p, m):
            text = schedule.to_text()
            back = Schedule.from_text(
                text, microbatches=m, chunks=schedule.chunks, layout=schedule.layout
            )
            assert back == schedule
            for row in schedule.actions:
                for a in row:
                    assert Action.parse(str(a)) == a


@pytest.mark.parametrize("p,m", CASES)
def test_v_schedules_memory_and_bubble(p, m):
    """ZB-V holds 1F1B's peak and beats ZB-H1 (same model: a V chunk is half a stage);
    DualPipeV holds at most one microbatch more than ZB-V."""
    v, h1, f = schedules.zero_bubble_v(p, m), zero_bubble(p, m), one_f_one_b(p, m)
    sim_v = simulate(v, forward=0.5, backward=1, weight=0.5)
    assert max(sim_v.peak_activations) == max(simulate(f).peak_activations) == min(p, m)
    if p > 1:
        assert sim_v.makespan < simulate(h1, forward=1, backward=2, weight=1).makespan
    assert max(simulate(schedules.dualpipe_v(p, m)).peak_activations) <= p + 1


def test_stage_of_and_place():
    v = schedules.zero_bubble_v(4, 8)
    assert [v.stage_of(r, c) for c in (0, 1) for r in range(4)] == [0, 1, 2, 3, 7, 6, 5, 4]
    assert [v.place(s) for s in (0, 3, 4, 7)] == [(0, 0), (3, 0), (3, 1), (0, 1)]
    looped = interleaved_1f1b(4, 8, 2)
    assert [looped.stage_of(r, 1) for r in range(4)] == [4, 5, 6, 7]
    assert looped.place(6) == (2, 1)


def test_overlaps_in_the_text_form():
    for order, backward in [("paper", ActionKind.B), ("greedy", ActionKind.I)]:
        d = schedules.dualpipe_v(4, 8, order=order)
        assert d.overlaps and "+" in d.to_text()
        rank, index = min(d.overlaps)
        pair = d.actions[rank][index : index + 2]
        assert {a.kind for a in pair} == {ActionKind.F, backward}
    s = Schedule.from_text("rank 0: 0F0 0F1+0B0 0B1", layout="looped")
    assert s.overlaps == {(0, 1)} and s.to_text() == "rank 0: 0F0 0F1+0B0 0B1"


def test_action_text_form():
    assert str(Action(0, ActionKind.F, 3)) == "0F3"
    assert Action.parse("12W7") == Action(12, ActionKind.W, 7)
    assert Action(1, ActionKind.B, 0).stage(rank=2, ranks=4) == 6


@pytest.mark.parametrize("text", ["0X3", "F3", "0F", "a", "0F-1", ""])
def test_bad_action_text(text):
    with pytest.raises(col.InvalidArgumentError, match="Action.parse: text is"):
        Action.parse(text)


def test_bad_schedule_text():
    with pytest.raises(col.InvalidArgumentError, match="line 1 is 'oops'"):
        Schedule.from_text("oops")
    with pytest.raises(col.InvalidArgumentError, match=r"ranks are \[0, 2\], expected 0..1"):
        Schedule.from_text("rank 0: 0F0\nrank 2: 0F0")
    with pytest.raises(
        col.InvalidArgumentError, match="actions has 1 rank lists, expected ranks=2"
    ):
        Schedule(2, 1, 1, ((),))
    with pytest.raises(col.InvalidArgumentError, match="layout is 'w', expected one of"):
        Schedule(1, 1, 1, ((),), layout="w")
    with pytest.raises(col.InvalidArgumentError, match="layout 'v' has chunks=3, expected 2"):
        Schedule(1, 1, 3, ((),), layout="v")


@pytest.mark.parametrize(
    "make,match",
    [
        (lambda: gpipe(0, 4), r"gpipe: stages is 0, expected an int >= 1"),
        (lambda: one_f_one_b(2, 0), r"one_f_one_b: microbatches is 0, expected an int >= 1"),
        (lambda: zero_bubble(2.0, 4), r"zero_bubble: stages is 2.0"),
        (lambda: zero_bubble_h2(2, -1), r"zero_bubble_h2: microbatches is -1"),
        (
            lambda: interleaved_1f1b(4, 9, 2),
            r"microbatches is 9, expected a multiple of stages=4 or of its 2 rounds",
        ),
        (lambda: interleaved_1f1b(2, 4, 0), r"interleaved_1f1b: chunks is 0, expected an int >= 1"),
        (
            lambda: schedules.interleaved_zero_bubble(8, 17, 2),
            r"interleaved_zero_bubble: microbatches is 17, expected a multiple of stages=8",
        ),
        (lambda: schedules.zero_bubble_v(2, 4, order="x"), r"zero_bubble_v: order is 'x'"),
        (
            lambda: schedules.dualpipe_v(4, 7, order="paper"),
            r"dualpipe_v: microbatches is 7, expected >= 2 \* stages = 8 for order='paper'",
        ),
    ],
)
def test_bad_arguments(make, match):
    with pytest.raises(col.InvalidArgumentError, match=match):
        make()


def test_pipeline_modules_import_without_cycles():
    """Every import between pipeline modules, lazy ones included (TYPE_CHECKING aside)."""
    import ast
    from pathlib import Path

    root = Path(schedules.__file__).parent
    edges = {}
    for path in root.glob("*.py"):
        tree = ast.parse(path.read_text())
        typing_only = {
            id(node)
            for block in ast.walk(tree)
            if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
            for stmt in block.body
            for node in ast.walk(stmt)
        }
        edges[path.stem] = {
            (node.module or "").lstrip(".") or alias.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.level == 1 and id(node) not in typing_only
            for alias in node.names
        }
    seen, done = set(), set()

    def visit(name, trail):
        assert name not in seen - done, f"import cycle: {' -> '.join(trail + [name])}"
        if name in done or name not in edges:
            return
        seen.add(name)
        for other in edges[name]:
            visit(other, trail + [name])
        done.add(name)

    for name in edges:
        visit(name, [])
    assert "_validate" in edges["_schedule"]  # the walk saw the imports
