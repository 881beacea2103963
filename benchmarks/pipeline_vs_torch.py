"""python -m benchmarks.pipeline_vs_torch [--markdown] [--ranks 2,3,4,5,6,7,8] [--saving 0.25]

Every pipeline schedule family that PyTorch's ``torch.distributed.pipelining`` also has,
ours against the published order of the same family, simulated at unit costs (F = I = W = 1
per full stage; half each with two chunks per rank), on the grid p = 2..8, m in {p, 2p, 4p}
and every m from p to 4p at p = 4 and 8. For each point: one step's makespan, the time per
step back to back (``pipeline.period``) and the peak activations (most of any rank, in
microbatches through a full stage), and ``ok`` where ours is at least as good on makespan
and period and, at equal makespan, on peak.

The reference ("ref") is the published order as ``pipeline._orders`` writes it (the orders
PyTorch's schedule classes build); where torch is installed, torch's own orders are built
too (each class's per-rank generator, no process group needed), converted into ``Schedule``
objects, validated, simulated and put in the "torch" columns. DualPipeV is compared twice:
pairs at the cost of their halves, and pairs that save ``--saving`` (of a chunk's F + B).
No MPI, no GPU: pure simulation (about a minute for the whole grid on one core).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from pipeline import Action, ActionKind, Schedule, period, simulate
from pipeline import schedules as S
from pipeline._orders import dualpipe_v_paper, interleaved, rounds_of, zbv_paper


def grid(ranks: list[int]) -> list[tuple[int, int]]:
    return [
        (p, m)
        for p in ranks
        for m in sorted({p, 2 * p, 4 * p} | (set(range(p, 4 * p + 1)) if p in (4, 8) else set()))
    ]


@dataclass(frozen=True)
class Family:
    """One family: ours, the reference order, torch's class (name, chunks), which points."""

    name: str
    ours: Callable[[int, int], Schedule]
    reference: Callable[[int, int], Schedule] | None
    torch_class: str
    chunks: int
    layout: str = "looped"
    accepts: Callable[[int, int], bool] = lambda p, m: True
    saving: float | None = None


def _looped(rows, p, m, chunks, name, overlaps=frozenset()) -> Schedule:
    return Schedule(p, m, chunks, rows, name, "looped", overlaps)


def families(saving: float) -> list[Family]:
    flexible = lambda p, m: rounds_of(p, m) is not None  # noqa: E731
    paper_v = lambda p, m: Schedule(p, m, 2, zbv_paper(p, m), "ref", "v")  # noqa: E731

    def deepseek(p: int, m: int) -> Schedule:
        rows, pairs = dualpipe_v_paper(p, m)
        return Schedule(p, m, 2, rows, "ref", "v", pairs)

    def best_dualpipe(p: int, m: int, cut: float | None) -> Schedule:
        options = [S.dualpipe_v(p, m, order="greedy")]
        if m >= 2 * p:
            options.append(S.dualpipe_v(p, m, order="paper"))
        return min(options, key=lambda s: (_numbers(s, cut)[0], _numbers(s, cut)[2]))

    return [
        Family(
            "interleaved 1F1B x2",
            lambda p, m: S.interleaved_1f1b(p, m, 2),
            lambda p, m: _looped(interleaved(p, m, 2, split=False), p, m, 2, "ref"),
            "ScheduleInterleaved1F1B",
            2,
            accepts=flexible,
        ),
        Family(
            "ZB-H1 / ZB-1P",
            S.zero_bubble,
            None,
            "ScheduleInterleavedZeroBubble",
            1,
            accepts=flexible,
        ),
        Family(
            "interleaved zero bubble x2",
            lambda p, m: S.interleaved_zero_bubble(p, m, 2),
            lambda p, m: _looped(interleaved(p, m, 2, split=True), p, m, 2, "ref"),
            "ScheduleInterleavedZeroBubble",
            2,
            accepts=flexible,
        ),
        Family("ZB-V", S.zero_bubble_v, paper_v, "ScheduleZBVZeroBubble", 2, "v"),
        Family(
            "DualPipeV",
            lambda p, m: best_dualpipe(p, m, None),
            deepseek,
            "ScheduleDualPipeV",
            2,
            "v",
            accepts=lambda p, m: m >= 2 * p,
        ),
        Family(
            f"DualPipeV, pair saves {saving:g}",
            lambda p, m: best_dualpipe(p, m, saving),
            deepseek,
            "ScheduleDualPipeV",
            2,
            "v",
            accepts=lambda p, m: m >= 2 * p,
            saving=saving,
        ),
    ]


def _numbers(schedule: Schedule, saving: float | None) -> tuple[float, float, float]:
    c = schedule.chunks
    costs = (1 / c, 2 / c, 1 / c)
    sim = simulate(schedule, *costs, saving=saving)
    return sim.makespan, period(schedule, *costs, saving=saving), max(sim.peak_activations)


def at_least_as_good(ours: tuple, theirs: tuple) -> bool:
    """Makespan and period no longer; at equal makespan, peak no higher."""
    eps = 1e-9
    if ours[0] > theirs[0] + eps or ours[1] > theirs[1] + eps:
        return False
    return not (abs(ours[0] - theirs[0]) <= eps and ours[2] > theirs[2] + eps)


# --- torch's own orders, where torch is installed ----------------------------------------


def torch_schedule(class_name: str, p: int, m: int, chunks: int, layout: str) -> Schedule:
    """Build torch's per-rank orders for ``class_name`` without a process group (each
    class's ``_calculate_single_rank_operations`` on a stand-in ``self``) and convert them."""
    from torch.distributed.pipelining import schedules as ts

    cls = getattr(ts, class_name)
    rounds = max(1, m // p)
    fake = SimpleNamespace(
        pp_group_size=p,
        n_local_stages=chunks,
        num_stages=p * chunks,
        _num_stages=p * chunks,
        _n_microbatches=m,
        number_of_rounds=rounds,
        microbatches_per_round=m // rounds,
        _stages=[None] * chunks,
    )
    fake.pipeline_order = {r: cls._calculate_single_rank_operations(fake, r) for r in range(p)}
    if "_add_bubbles_to_actions" in cls.__dict__:  # only where the class adds its own
        fake.pipeline_order = cls._add_bubbles_to_actions(fake, p * chunks)
    kinds = {
        "FORWARD": ActionKind.F,
        "FULL_BACKWARD": ActionKind.B,
        "BACKWARD_INPUT": ActionKind.I,
        "BACKWARD_WEIGHT": ActionKind.W,
    }

    def chunk_of(stage: int) -> int:
        if layout == "v":
            return 0 if stage < p else 1
        return stage // p

    rows, pairs = [], set()
    for r in range(p):
        row: list[Action] = []
        for act in fake.pipeline_order[r]:
            if act is None:
                continue
            subs = getattr(act, "sub_actions", None)
            if subs:
                pairs.add((r, len(row)))
            for a in subs or (act,):
                kind = kinds[a.computation_type.name]
                row.append(Action(chunk_of(a.stage_index), kind, a.microbatch_index))
        rows.append(tuple(row))
    return Schedule(p, m, chunks, tuple(rows), "torch", layout, frozenset(pairs)).validate()


def torch_available() -> bool:
    try:
        import torch.distributed.pipelining  # noqa: F401
    except Exception:  # not installed, or built without distributed
        return False
    return True


def compare(ranks: list[int], saving: float, with_torch: bool) -> list[dict[str, Any]]:
    rows = []
    for family in families(saving):
        for p, m in grid(ranks):
            if not family.accepts(p, m):
                continue
            row: dict[str, Any] = {"family": family.name, "p": p, "m": m}
            row["ours"] = _numbers(family.ours(p, m), family.saving)
            row["bound"] = 3 * m + (p - 1) / family.chunks
            if family.reference is not None:
                row["ref"] = _numbers(family.reference(p, m), family.saving)
            if with_torch:
                try:
                    t = torch_schedule(family.torch_class, p, m, family.chunks, family.layout)
                    row["torch"] = _numbers(t, family.saving)
                except Exception as error:  # a class that refuses this shape
                    row["torch_error"] = f"{type(error).__name__}: {error}"
            for other in ("ref", "torch"):
                if other in row:
                    row[f"ok_{other}"] = at_least_as_good(row["ours"], row[other])
            rows.append(row)
    return rows


def _cell(numbers: tuple | None) -> str:
    return "" if numbers is None else f"{numbers[0]:g} / {numbers[1]:g} / {numbers[2]:g}"


def report(rows: list[dict[str, Any]], markdown: bool, with_torch: bool) -> str:
    others = ["ref"] + (["torch"] if with_torch else [])
    head = ["family", "p", "m", "bound", "ours"] + others + [f"ok vs {o}" for o in others]
    lines = []
    if markdown:
        lines.append("| " + " | ".join(head) + " |")
        lines.append("|" + " --- |" * len(head))
    else:
        lines.append("# makespan / period / peak activations, F = I = W = 1 per full stage")
        lines.append("  ".join(f"{h:<22}" if i == 0 else f"{h:>18}" for i, h in enumerate(head)))
    for row in rows:
        cells = [row["family"], str(row["p"]), str(row["m"]), f"{row['bound']:g}"]
        cells.append(_cell(row["ours"]))
        cells += [_cell(row.get(o)) or row.get(f"{o}_error", "")[:40] for o in others]
        cells += [{True: "ok", False: "WORSE", None: ""}[row.get(f"ok_{o}")] for o in others]
        if markdown:
            lines.append("| " + " | ".join(cells) + " |")
        else:
            lines.append(
                "  ".join(f"{c:<22}" if i == 0 else f"{c:>18}" for i, c in enumerate(cells))
            )
    for o in others:
        compared = [r for r in rows if f"ok_{o}" in r]
        good = sum(r[f"ok_{o}"] for r in compared)
        lines.append(
            f"# ours at least as good as {o} at {good} of {len(compared)} points"
            + ("" if good == len(compared) else "  <- NOT ALL")
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[1])
    parser.add_argument("--ranks", default="2,3,4,5,6,7,8", help="comma-separated p values")
    parser.add_argument("--saving", type=float, default=0.25, help="what a DualPipeV pair saves")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table")
    parser.add_argument("--no-torch", action="store_true", help="skip torch even if installed")
    args = parser.parse_args(argv)
    ranks = [int(x) for x in args.ranks.split(",")]
    with_torch = not args.no_torch and torch_available()
    rows = compare(ranks, args.saving, with_torch)
    print(report(rows, args.markdown, with_torch))
    if not with_torch:
        print("# torch not installed: the reference is the published order (pipeline._orders)")
    return 0 if all(r.get("ok_ref", True) and r.get("ok_torch", True) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
