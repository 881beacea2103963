#!/bin/bash
# benchmarks/results/cpu-2core-2026-11-25-c-work/run.sh OUT_DIR VENV NP TREE...
# As the 2026-11-24 folder's run.sh (every verb against mpi4py, the TREEs' runs interleaved),
# for the forms that the C Work, the group's held Works and the in-place reduce_scatter
# changed: MODES (default "async") for OPS (default every verb), and reduce_scatter and
# sendrecv sync. JSON in OUT_DIR/<basename of TREE>/.
OUT=${1:?usage: run.sh OUT_DIR VENV NP TREE...}; VENV=$2; NP=$3; shift 3
OPS=${OPS:-"all_reduce reduce broadcast all_gather reduce_scatter all_to_all gather scatter sendrecv"}
MODES=${MODES:-async}
run() {  # op mode
  local flag=""; [ "$2" = async ] && flag="--async"
  for tree in $TREES; do
    D=$OUT/$(basename "$tree"); mkdir -p "$D"
    cd "$tree" || exit 1
    if [ "$NP" = 2 ]; then
      timeout 300 $VENV/bin/mpiexec -n 2 $VENV/bin/python -m benchmarks.collective --op $1 -b 8 \
        -e 1K -f 2 --baseline mpi4py --rounds 21 $flag --json "$D/$1-$2-small.json" > /dev/null
      timeout 300 $VENV/bin/mpiexec -n 2 $VENV/bin/python -m benchmarks.collective --op $1 -b 1M \
        -e 1M --baseline mpi4py --rounds 21 $flag --json "$D/$1-$2-1M.json" > /dev/null
    else
      timeout 300 $VENV/bin/mpiexec -n $NP $VENV/bin/python -m benchmarks.collective --op $1 \
        -b 1K -e 1K --baseline mpi4py --rounds 21 $flag --json "$D/$1-$2-small.json" > /dev/null
    fi
    echo "$tree $1 $2 done $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg)"
  done
}
TREES="$*"
for op in $OPS; do
  for mode in $MODES; do run $op $mode; done
done
for op in reduce_scatter sendrecv; do
  case " $MODES " in *" sync "*) ;; *) run $op sync ;; esac
done
