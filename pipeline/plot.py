"""Pictures of schedules and timelines as PNG files (needs matplotlib, imported lazily).

Example:
    >>> from pipeline import plot, schedules, simulate
    >>> plot.schedule(schedules.zero_bubble(4, 8), "zb.png")  # doctest: +SKIP
    PosixPath('zb.png')
    >>> plot.timelines([simulate(schedules.one_f_one_b(4, 8)), simulate(schedules.zero_bubble(4, 8))], "cmp.png")  # doctest: +SKIP
    PosixPath('cmp.png')
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from ._schedule import Schedule
from ._simulate import Simulation, simulate

#: one colour per action kind (F, B, I, W)
COLOURS = {"F": "#4c8bd6", "B": "#e0803c", "I": "#e6b33c", "W": "#5aa469"}


def schedule(
    schedule: Schedule,
    path: str | Path,
    *,
    forward: float = 1.0,
    backward: float = 2.0,
    weight=None,
) -> Path:
    """Draw ``schedule`` as simulated with these costs; returns the path written."""
    return timelines([simulate(schedule, forward, backward, weight)], path)


def timelines(
    simulations: Sequence[Simulation], path: str | Path, *, titles=None, unit: str = ""
) -> Path:
    """One panel per simulation (or measured trace, see ``from_trace``), ranks x time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    path = Path(path)
    fig, axes = plt.subplots(
        len(simulations), 1, figsize=(12, 0.55 * sum(s.schedule.ranks + 2 for s in simulations) + 0.6),
        squeeze=False, sharex=True,
    )  # fmt: skip
    for k, (ax, sim) in enumerate(zip(axes[:, 0], simulations)):
        # one bar collection per (band, kind): adding a collection re-fits the shared axes,
        # which one per action made the bulk of the drawing time
        bars: dict[tuple[float, float, str], list[tuple[float, float]]] = {}
        for row in sim.timeline:
            for i, e in enumerate(row):
                width = e.end - e.start
                # an overlapped pair shares one interval: forward above, backward below
                paired = any(0 <= j < len(row) and (row[j].start, row[j].end) == (e.start, e.end)
                             for j in (i - 1, i + 1))  # fmt: skip
                top, height = e.rank - 0.4, 0.8
                if paired:
                    top, height = (
                        (e.rank - 0.4, 0.4) if e.action.kind.name == "F" else (e.rank, 0.4)
                    )
                bars.setdefault((top, height, e.action.kind.name), []).append((e.start, width))
                if width >= 0.012 * sim.makespan:
                    label = str(e.action.microbatch)
                    if sim.schedule.chunks > 1:  # model stage : microbatch
                        label = f"{sim.schedule.stage_of(e.rank, e.action.chunk)}:{label}"
                    ax.text(e.start + width / 2, top + height / 2, label,
                            ha="center", va="center", fontsize=7 if sim.schedule.chunks == 1 else 5)  # fmt: skip
        for (top, height, kind), spans in bars.items():
            ax.broken_barh(spans, (top, height), facecolors=COLOURS[kind], edgecolor="white",
                           linewidth=0.5)  # fmt: skip
        ax.set_yticks(range(sim.schedule.ranks))
        ax.set_yticklabels([_rank_label(sim.schedule, r) for r in range(sim.schedule.ranks)])
        ax.invert_yaxis()
        title = titles[k] if titles else sim.schedule.name
        ax.set_title(
            f"{title}: makespan {sim.makespan:.4g}{unit}, bubble {sim.bubble_fraction:.1%}",
            fontsize=9,
        )
    kinds = sorted({e.action.kind.name for s in simulations for row in s.timeline for e in row},
                   key="FBIW".index)  # fmt: skip
    axes[0, 0].legend(handles=[Patch(color=COLOURS[k], label=k) for k in kinds],
                      loc="upper right", fontsize=7, ncol=len(kinds))  # fmt: skip
    axes[-1, 0].set_xlabel(f"time{' (' + unit.strip() + ')' if unit else ''}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _rank_label(schedule: Schedule, rank: int) -> str:
    """``rank 0`` or, where a rank holds several chunks, ``rank 0: 0,7`` (its model stages)."""
    if schedule.chunks == 1:
        return f"rank {rank}"
    stages = ",".join(str(schedule.stage_of(rank, c)) for c in range(schedule.chunks))
    return f"rank {rank}: {stages}"
