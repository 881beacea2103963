"""The MPI backend on mpi4py: its verbs, tables, calls in parts, max/min ops and the watchdog of blocking calls."""
