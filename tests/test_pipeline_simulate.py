"""Simulation numbers (the textbook results), text grids, PNG pictures."""

from __future__ import annotations

import pytest

import collectives as col
from pipeline import Schedule, from_trace, grid, period, schedules, simulate
from pipeline.schedules import gpipe, interleaved_1f1b, one_f_one_b, zero_bubble, zero_bubble_h2

pytestmark = pytest.mark.mpi_independent  # schedules simulated in one process: no MPI job


@pytest.mark.parametrize("make", [gpipe, one_f_one_b])
def test_gpipe_and_1f1b_p4_m8(make):
    sim = simulate(make(4, 8), forward=1, backward=2)
    assert sim.makespan == 33
    assert sim.bubble_fraction == pytest.approx(3 / 11)
    assert sim.bubble == pytest.approx(4 * 9)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 8), (3, 7)])
def test_bubble_formula(p, m):
    sim = simulate(one_f_one_b(p, m), forward=1, backward=2)
    assert sim.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize("p,m,chunks", [(4, 8, 2), (4, 16, 2), (4, 16, 4), (2, 8, 2), (8, 16, 2)])
def test_interleaving_divides_the_bubble_by_chunks(p, m, chunks):
    base = simulate(one_f_one_b(p, m), forward=1, backward=2)
    # the same model cut into `chunks` times as many stages: each chunk does 1/chunks of the work
    inter = simulate(interleaved_1f1b(p, m, chunks), forward=1 / chunks, backward=2 / chunks)
    assert inter.bubble / p == pytest.approx(base.bubble / p / chunks)
    assert sum(inter.busy) == pytest.approx(sum(base.busy))


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (4, 16), (8, 16), (8, 32)])
def test_zero_bubble_h1_has_a_third_of_1f1b_bubble(p, m):
    base = simulate(one_f_one_b(p, m), forward=1, backward=2)
    zb = simulate(zero_bubble(p, m), forward=1, backward=2, weight=1)
    assert zb.bubble == pytest.approx(base.bubble / 3)  # (p-1)(F+I-W) vs (p-1)(F+I+W)
    assert zb.makespan == 3 * m + p - 1
    h2 = simulate(zero_bubble_h2(p, m), forward=1, backward=2, weight=1)
    assert h2.makespan <= zb.makespan


def test_split_costs_and_comm_cost():
    sim = simulate(zero_bubble(1, 2), forward=1, backward=3, weight=1)
    assert [(str(e.action), e.start, e.end) for e in sim.timeline[0]] == [
        ("0F0", 0, 1), ("0I0", 1, 3), ("0W0", 3, 4), ("0F1", 4, 5), ("0I1", 5, 7), ("0W1", 7, 8)
    ]  # fmt: skip
    plain = simulate(one_f_one_b(2, 1), forward=1, backward=2)
    hops = simulate(one_f_one_b(2, 1), forward=1, backward=2, comm=0.5)
    assert hops.makespan == plain.makespan + 2 * 0.5


def test_bad_costs():
    with pytest.raises(col.InvalidArgumentError, match="simulate: forward is -1, expected >= 0"):
        simulate(gpipe(2, 2), forward=-1)
    with pytest.raises(col.InvalidArgumentError, match="weight is 3, expected <= backward=2"):
        simulate(zero_bubble(2, 2), weight=3)


def test_cannot_finish():
    stuck = Schedule.from_text("rank 0: 0B0 0F0\nrank 1: 0F0 0B0")
    with pytest.raises(col.InvalidArgumentError, match="cannot finish"):
        simulate(stuck)


def test_grids():
    assert grid(gpipe(2, 2)) == "rank 0 | 0F0 0F1 0B0 0B1\nrank 1 | 0F0 0F1 0B0 0B1"
    picture = simulate(one_f_one_b(2, 2), forward=1, backward=1).grid()
    assert picture.splitlines() == [
        "rank 0 | 0F0 0F1   . 0B0   . 0B1",
        "rank 1 |   . 0F0 0B0 0F1 0B1   .",
    ]
    assert "rank 3" in str(one_f_one_b(4, 4))


def test_from_trace():
    s = one_f_one_b(2, 1)
    traces = [[(s.actions[0][0], 10.0, 11.0), (s.actions[0][1], 13.0, 15.0)],
              [(s.actions[1][0], 11.0, 12.0), (s.actions[1][1], 12.0, 13.0)]]  # fmt: skip
    sim = from_trace(s, traces)
    assert sim.makespan == 5.0
    assert sim.bubble_fraction == pytest.approx(1 - 5 / 10)


def test_plot_files(tmp_path):
    pytest.importorskip("matplotlib")
    from pipeline import plot

    one = plot.schedule(zero_bubble(4, 8), tmp_path / "zb.png")
    two = plot.timelines(
        [simulate(one_f_one_b(4, 8)), simulate(interleaved_1f1b(4, 8, 2), 0.5, 1)],
        tmp_path / "cmp.png",
        titles=["1F1B", "interleaved"],
    )
    for path in (one, two):
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert path.stat().st_size > 5000


def test_peak_activations_count_a_chunk_as_its_share():
    assert simulate(one_f_one_b(4, 8)).peak_activations == (4, 3, 2, 1)
    assert simulate(gpipe(2, 3)).peak_activations == (3, 3)
    # Megatron's warm-up on rank 0: 2(p-1) + p + 1 = 11 chunk activations of 1/2 each
    assert simulate(interleaved_1f1b(4, 8, 2)).peak_activations[0] == 5.5


def test_overlapped_pairs_have_their_own_cost():
    d = schedules.dualpipe_v(4, 8, order="greedy")  # pairs F with I
    plain = simulate(d, forward=0.5, backward=1, weight=0.5)
    same = simulate(d, forward=0.5, backward=1, weight=0.5, overlap=1.0)  # F + I
    hidden = simulate(d, forward=0.5, backward=1, weight=0.5, overlap=0.6)
    assert plain.makespan == same.makespan
    assert hidden.makespan < plain.makespan
    pairs = [e for row in hidden.timeline for e in row if e.end - e.start == pytest.approx(0.6)]
    assert len(pairs) == 2 * len(d.overlaps)
    assert sum(hidden.busy) == pytest.approx(4 * 8 * 2 * 1.5 - len(d.overlaps) * (1.0 - 0.6))


def test_a_saving_takes_the_same_off_every_pair():
    d = schedules.dualpipe_v(4, 8, order="paper")  # pairs F with B
    saved = simulate(d, forward=0.5, backward=1, weight=0.5, saving=0.25)
    pairs = [e for row in saved.timeline for e in row if e.end - e.start == pytest.approx(1.25)]
    assert len(pairs) == 2 * len(d.overlaps) > 0
    assert sum(saved.busy) == pytest.approx(4 * 8 * 2 * 1.5 - len(d.overlaps) * 0.25)
    with pytest.raises(col.InvalidArgumentError, match="overlap is 1 and saving is 0.5"):
        simulate(d, overlap=1, saving=0.5)


def test_best_picks_the_shortest_that_fits():
    choice = schedules.best(4, 8, forward=1, backward=2, weight=1, max_activations=4)
    assert choice.schedule.name == "interleaved-zb x4" and choice.simulation.makespan == 24.75
    names = [c.schedule.name for c in choice.compared]
    assert names[:2] == ["gpipe", "1f1b"] and "dualpipe-v" in names and "zb-h2" in names
    assert "zb-v greedy" in names and "dualpipe-v greedy" in names
    assert all(c.makespan >= 24.75 for c in choice.compared if c.fits)
    table = str(choice)
    assert "interleaved-zb x4" in table.splitlines()[names.index("interleaved-zb x4") + 1]
    assert "<- best" in table
    # the V schedules alone: the paper's ZB-V and the greedy one tie; ties go to the first
    v = schedules.best(4, 8, forward=1, backward=2, weight=1, max_activations=4, max_chunks=1)
    assert v.schedule.name == "zb-v" and v.simulation.makespan == 25.5
    # DeepSeek's pairs of F and B pay once a pair saves something
    hidden = schedules.best(4, 8, forward=1, backward=2, weight=1, saving=0.5)
    assert hidden.schedule.name == "dualpipe-v" and hidden.simulation.makespan == 24.5
    # dear hops favour GPipe, whose transfers overlap the most computation
    assert schedules.best(4, 4, forward=1, backward=2, comm=5).schedule.name == "gpipe"
    # between steps the paper's ZB-V runs at 3m at 1F1B's peak; ZB-H2 ties at 7
    steady = schedules.best(4, 8, forward=1, backward=2, weight=1, between_steps=True)
    assert steady.schedule.name == "zb-v" and "period" in str(steady)
    periods = {c.schedule.name: c.period for c in steady.compared}
    assert periods["zb-v"] == periods["zb-h2"] == 24.0 and periods["zb-v greedy"] == 25.5
    with pytest.raises(col.InvalidArgumentError, match="no schedule keeps peak activations"):
        schedules.best(4, 8, forward=1, backward=2, max_activations=1)


@pytest.mark.parametrize("p", [2, 3, 4, 8])
def test_zero_bubble_h2_has_no_bubble_between_steps(p):
    """With 2p or more microbatches, ZB-H2's steps interlock (the paper's zero bubble at
    F = I = W); ZB-H1 keeps its (p - 1) per step."""
    for m in (2 * p, 2 * p + 3):
        assert period(schedules.zero_bubble_h2(p, m), 1, 2, 1) == 3 * m
        assert period(schedules.zero_bubble(p, m), 1, 2, 1) == 3 * m + p - 1
    assert period(one_f_one_b(p, 2 * p), 1, 2) == simulate(one_f_one_b(p, 2 * p)).makespan
