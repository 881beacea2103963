"""The outer pytest process: tests/spmd runs only under mpiexec, via tests/test_spmd.py."""

import os
from collections import Counter

from tests.emulated_gpu import switch_on

switch_on()  # COLLECTIVES_TEST_EMULATED_GPUS: every rank imports the emulated CuPy

_UNDER_MPI = any(
    v in os.environ for v in ("SPMD_REPORT_DIR", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
)
collect_ignore = [] if _UNDER_MPI else ["spmd"]


def pytest_terminal_summary(terminalreporter):
    """Inner SPMD outcomes (rank 0 of each launch), with every reason for a skip: an outer
    test passes when its inner ones pass or skip, so the skips are shown here."""
    launches = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            for name, value in getattr(report, "user_properties", ()):
                if name == "spmd" and getattr(report, "when", None) == "call":
                    launches.append(value)
    if not launches:
        return
    totals: Counter = Counter()
    reasons: Counter = Counter()
    where: dict[str, set] = {}
    for launch in launches:
        totals.update(launch["counts"])
        for detail in launch["skipped"]:
            reason = detail.removeprefix("Skipped: ")
            reasons[reason] += 1
            where.setdefault(reason, set()).add(launch["launch"])
    backend = os.environ.get("COLLECTIVES_TEST_BACKEND", "mpi")
    write = terminalreporter.write_line
    terminalreporter.write_sep("=", f"inner SPMD tests, COLLECTIVES_TEST_BACKEND={backend}")
    counted = ", ".join(f"{n} {outcome}" for outcome, n in sorted(totals.items()))
    write(f"{len(launches)} module runs; rank 0 of each: {counted or 'nothing ran'}")
    for reason, n in reasons.most_common():
        shown = sorted(where[reason])
        more = f" and {len(shown) - 3} more" if len(shown) > 3 else ""
        write(f"{n} skipped: {reason} (in {', '.join(shown[:3])}{more})")
