#!/bin/bash
# benchmarks/results/cpu-2core-2026-11-26-books-trimmed/run.sh [VENV_DIR]
# Every verb against mpi4py, sync and async, after the books were trimmed (5e5c44f): the
# 2026-11-25 sendrecv folder's run.sh, its JSON here, 4 ranks once on each MPI.
HERE=$(cd "$(dirname "$0")" && pwd)
OUT_DIR=$HERE MPICH_NP4_RUNS=1 bash "$HERE/../cpu-2core-2026-11-25-sendrecv/run.sh" "$@"
# The other folders here, made by hand the same day:
#   ab-before-after/MPI/{before,after}: the c-work run.sh with the trees 3c18525
#     (before) and 5e5c44f (after) interleaved: MODES="sync async" run.sh OUT VENV 2 BEFORE AFTER
#   mpich-{nonblocking,blocking}-np2: MPICH's synchronous calls non-blocking (the default) and
#     blocking (COLLECTIVES_MPI_BLOCKING=1), 8 B-1 KiB, 21 rounds, against mpi4py:
#     COLLECTIVES_MPI_BLOCKING=B mpiexec -n 2 python -m benchmarks.collective --op OP -b 8 -e 1K \
#       -f 2 --baseline mpi4py --rounds 21 --json DIR/OP.json
