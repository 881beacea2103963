#!/bin/bash
# benchmarks/results/cpu-2core-2026-11-25-c-books/run.sh OUT_DIR VENV NP TREE...
# Every verb, sync and async, against mpi4py, through each TREE (a checkout with VENV built in
# it) in turn for each verb and mode, so that the trees' runs interleave: 8 B-1 KiB and 1 MiB
# at 2 ranks, 1 KiB alone at more. JSON in OUT_DIR/<basename of TREE>/.
OUT=${1:?usage: run.sh OUT_DIR VENV NP TREE...}; VENV=$2; NP=$3; shift 3
OPS="all_reduce reduce broadcast all_gather reduce_scatter all_to_all gather scatter sendrecv"
for op in $OPS; do
  for mode in sync async; do
    flag=""; [ $mode = async ] && flag="--async"
    for tree in "$@"; do
      D=$OUT/$(basename "$tree"); mkdir -p "$D"
      cd "$tree" || exit 1
      if [ "$NP" = 2 ]; then
        timeout 300 $VENV/bin/mpiexec -n 2 $VENV/bin/python -m benchmarks.collective --op $op -b 8 \
          -e 1K -f 2 --baseline mpi4py --rounds 21 $flag --json "$D/$op-$mode-small.json" > /dev/null
        timeout 300 $VENV/bin/mpiexec -n 2 $VENV/bin/python -m benchmarks.collective --op $op -b 1M \
          -e 1M --baseline mpi4py --rounds 21 $flag --json "$D/$op-$mode-1M.json" > /dev/null
      else
        timeout 300 $VENV/bin/mpiexec -n $NP $VENV/bin/python -m benchmarks.collective --op $op \
          -b 1K -e 1K --baseline mpi4py --rounds 21 $flag --json "$D/$op-$mode-small.json" > /dev/null
      fi
      echo "$tree $op $mode done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    done
  done
done
