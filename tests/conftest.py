"""The outer pytest process: tests/spmd runs only under mpiexec, via tests/test_spmd.py."""

import os

_UNDER_MPI = any(
    v in os.environ for v in ("SPMD_REPORT_DIR", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
)
collect_ignore = [] if _UNDER_MPI else ["spmd"]
