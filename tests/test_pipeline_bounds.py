"""Every schedule against the papers' numbers on the grid p = 2..8, m in {p, 2p, 4p} (and
every m from p to 4p at p = 4 and 8), at F = I = W = 1 per full stage (half per chunk with
two chunks): a schedule that gets slower, or holds more memory, fails here.

The bounds: a rank holds 3m units of work, and the last rank cannot start before the
forward has crossed the p - 1 ranks ahead of it, (p - 1) / c units with c chunks per rank;
so no step is shorter than 3m + (p - 1) / c. Steps back to back (``pipeline.period``) can
hide that start-up, never the 3m.
"""

from __future__ import annotations

import pytest

from pipeline import period, simulate
from pipeline import schedules as S

pytestmark = pytest.mark.mpi_independent  # schedules' arithmetic: no MPI

GRID = [
    (p, m)
    for p in range(2, 9)
    for m in sorted({p, 2 * p, 4 * p} | (set(range(p, 4 * p + 1)) if p in (4, 8) else set()))
]


def numbers(schedule, **options):
    c = schedule.chunks
    costs = (1 / c, 2 / c, 1 / c)
    sim = simulate(schedule, *costs, **options)
    return sim.makespan, max(sim.peak_activations), sim


@pytest.mark.parametrize("p,m", GRID)
def test_one_step_against_the_papers(p, m):
    work = 3 * m
    for make in (S.gpipe, S.one_f_one_b):  # (p - 1)(F + B) idle per rank
        assert numbers(make(p, m))[0] == work + 3 * (p - 1)
    makespan, peak, _ = numbers(S.zero_bubble(p, m))  # ZB-H1: (p - 1)(F + I - W)
    assert makespan == work + (p - 1) and peak <= p
    makespan, peak, _ = numbers(S.zero_bubble_h2(p, m))
    assert makespan == work + (p - 1) and peak <= 2 * p - 1
    if m % p == 0:  # Megatron: the bubble divided by the chunks
        for chunks in (2, 4):
            assert numbers(S.interleaved_1f1b(p, m, chunks))[0] == work + 3 * (p - 1) / chunks
    group = S.rounds_of(p, m)  # microbatches per round
    if group is not None:  # interleaved zero bubble reaches the bound at 2 chunks
        makespan, peak, _ = numbers(S.interleaved_zero_bubble(p, m, 2))
        assert makespan == work + (p - 1) / 2 and peak == min((p + group) / 2, m)
    # ZB-V: the bound (p - 1) / 2 once the V is full, 1F1B's peak; below 2p - 1 the greedy
    # order may be shorter, and auto never takes the longer of the two
    v = S.zero_bubble_v(p, m)
    makespan, peak, _ = numbers(v)
    assert makespan >= work + (p - 1) / 2 and peak == p
    if m >= 2 * p - 1:
        assert makespan == work + (p - 1) / 2
    for order in ("paper", "greedy"):
        assert makespan <= numbers(S.zero_bubble_v(p, m, order=order))[0]
    # DualPipeV: with no saving, at least the bound; DeepSeek's order at half a microbatch
    # over 1F1B's peak, the greedy one at one over
    for order in ("paper", "greedy") if m >= 2 * p else ("greedy",):
        d = S.dualpipe_v(p, m, order=order)
        makespan, peak, _ = numbers(d)
        assert makespan >= work + (p - 1) / 2
        assert peak <= p + (0.5 if order == "paper" else 1)


@pytest.mark.parametrize("p,m", [(p, m) for p, m in GRID if m >= 2 * p - 1])
def test_between_steps_against_the_papers(p, m):
    """ZB-V in the paper's order runs at exactly 3m per step, at 1F1B's peak."""
    v = S.zero_bubble_v(p, m)
    assert period(v, 0.5, 1, 0.5) == 3 * m
    if m >= 2 * p:  # ZB-H2 too, at up to 2p - 1 microbatches alive
        assert period(S.zero_bubble_h2(p, m), 1, 2, 1) == 3 * m


@pytest.mark.parametrize("p,m", [(8, 32), (4, 8), (4, 16)])
def test_dualpipe_v_pairs_pay_off(p, m):
    """With pairs that save 0.25 (of a chunk's F + B = 1.5), DeepSeek's order (about twice
    the pairs) is the shorter; with none, the greedy order is; best() sees both."""
    paper, greedy = (S.dualpipe_v(p, m, order=o) for o in ("paper", "greedy"))
    assert len(paper.overlaps) > len(greedy.overlaps)
    saved = [numbers(d, saving=0.25)[0] for d in (paper, greedy)]
    plain = [numbers(d)[0] for d in (paper, greedy)]
    assert saved[0] < saved[1] and plain[1] < plain[0]
    choice = S.best(p, m, forward=1, backward=2, weight=1, saving=0.5, max_chunks=1)
    assert choice.schedule.name == "dualpipe-v" and choice.simulation.makespan == saved[0]


@pytest.mark.parametrize("p", range(2, 9))
def test_interleaved_1f1b_at_one_round_keeps_megatrons_warm_up(p):
    """At m = p, rank r holds (chunks - 1)p + 2(p - 1 - r) + 1 chunk activations (at most
    all 2p): 2.5 microbatches on the last rank at p = 4, 4.5 at p = 8, same makespan."""
    s = S.interleaved_1f1b(p, p, 2)
    want = tuple(min(p + 2 * (p - 1 - r) + 1, 2 * p) / 2 for r in range(p))
    assert simulate(s).peak_activations == want
    assert numbers(s)[0] == 3 * p + 3 * (p - 1) / 2
