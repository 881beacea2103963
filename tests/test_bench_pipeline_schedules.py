"""benchmarks.pipeline_schedules' summary of measured actions (no MPI job)."""

from __future__ import annotations

import pytest

import pipeline
from benchmarks.pipeline_schedules import make, summarize

pytestmark = pytest.mark.mpi_independent  # arithmetic on made-up traces: no MPI job


def _gathered(schedule, cost: dict[str, float]) -> list[dict]:
    """Every rank's trace of one step, each action taking ``cost[kind]`` seconds in turn."""
    ranks = []
    for actions in schedule.actions:
        trace, now = [], 0.0
        for action in actions:
            trace.append((action, now, now + cost[action.kind.name]))
            now += cost[action.kind.name]
        ranks.append({"steps": [now], "traces": [trace]})
    return ranks


@pytest.mark.parametrize("name", ["dualpipe-v", "zb-h1", "1f1b"])
def test_a_weight_step_timed_longer_than_a_whole_backward_is_simulated(name):
    """Measured on a loaded machine, a W can outlast a whole B (DualPipe-V has both): the
    simulation takes W's share of a split backward instead of refusing W > B."""
    schedule = make(name, 2, 8, 1)
    cost = {"F": 1.0, "B": 0.75, "I": 0.3, "W": 1.2}
    row = summarize(schedule, _gathered(schedule, cost))
    assert row["simulated"]["makespan_ms"] > 0
    kinds = {a.kind.name for acts in schedule.actions for a in acts}
    assert set(row["action_ms"]) == kinds
    if {"B", "W"} <= kinds:  # whole and split backwards: W's share of a split one, of a B
        want = pipeline.simulate(schedule, 1.0, 0.75, 0.75 * 1.2 / (0.3 + 1.2)).makespan
    elif "W" in kinds:  # split backwards only: I + W and W themselves are simulated
        want = pipeline.simulate(schedule, 1.0, 0.3 + 1.2, 1.2).makespan
    else:
        want = pipeline.simulate(schedule, 1.0, 0.75, None).makespan
    assert row["simulated"]["makespan_ms"] == pytest.approx(1e3 * want)
