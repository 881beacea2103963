"""benchmarks.pipeline_vs_torch: ours at least as good as the published orders; where torch
is installed, the published orders are torch's own, action for action."""

from __future__ import annotations

import pytest

from benchmarks import pipeline_vs_torch as bench
from pipeline import Schedule, simulate


def test_ours_at_least_as_good_as_the_published_orders():
    rows = bench.compare([2, 3], saving=0.25, with_torch=False)
    assert {r["family"] for r in rows} >= {"ZB-V", "DualPipeV", "interleaved zero bubble x2"}
    assert all(r["ok_ref"] for r in rows if "ref" in r)
    text = bench.report(rows, markdown=True, with_torch=False)
    assert "| ZB-V | 3 | 6 | 19 | 19 / 18 / 3 | 19 / 18 / 3 | ok |" in text


def test_the_verdict_reads_makespan_period_then_peak():
    assert bench.at_least_as_good((10, 9, 4), (10, 9, 4))
    assert not bench.at_least_as_good((10, 9.5, 3), (10, 9, 4))
    assert not bench.at_least_as_good((10, 9, 4.5), (10, 9, 4))
    assert bench.at_least_as_good((9.5, 9, 4.5), (10, 9, 4))


@pytest.mark.parametrize(
    "family,p,m",
    [("ZB-V", 4, 8), ("ZB-V", 4, 5), ("DualPipeV", 4, 8), ("interleaved 1F1B x2", 4, 6),
     ("interleaved zero bubble x2", 4, 8), ("interleaved 1F1B x2", 4, 4)],
)  # fmt: skip
def test_published_orders_are_torchs(family, p, m):
    pytest.importorskip("torch.distributed.pipelining")
    f = next(f for f in bench.families(0.25) if f.name == family)
    ours = f.reference(p, m)
    theirs = bench.torch_schedule(f.torch_class, p, m, f.chunks, f.layout)
    assert isinstance(theirs, Schedule)
    assert theirs.actions == ours.actions and theirs.overlaps == ours.overlaps
    assert simulate(theirs).makespan == simulate(ours).makespan
