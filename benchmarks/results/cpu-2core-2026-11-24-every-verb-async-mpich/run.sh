#!/bin/bash
# benchmarks/results/cpu-2core-2026-11-24-every-verb-async-mpich/run.sh OUT_DIR
# Every verb, sync and async, 8 B-1 KiB and 1 MiB, 2 ranks, against mpi4py (run from anywhere).
cd "$(dirname "$0")/../../.." || exit 1
D=${1:?usage: run.sh OUT_DIR}
mkdir -p "$D"
OPS="all_reduce reduce broadcast all_gather reduce_scatter all_to_all gather scatter sendrecv"
for op in $OPS; do
  for mode in sync async; do
    flag=""; [ $mode = async ] && flag="--async"
    timeout 300 .venv/bin/mpiexec -n 2 .venv/bin/python -m benchmarks.collective --op $op -b 8 -e 1K -f 2 \
      --baseline mpi4py --rounds 21 $flag --json "$D/$op-$mode-small.json" > /dev/null
    timeout 300 .venv/bin/mpiexec -n 2 .venv/bin/python -m benchmarks.collective --op $op -b 1M -e 1M \
      --baseline mpi4py --rounds 21 $flag --json "$D/$op-$mode-1M.json" > /dev/null
    echo "$op $mode done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
done
