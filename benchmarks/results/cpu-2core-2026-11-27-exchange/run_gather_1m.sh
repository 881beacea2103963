#!/bin/bash
# benchmarks/results/cpu-2core-2026-11-27-exchange/run_gather_1m.sh BEFORE_TREE [VENV_DIR]
# Intel MPI's synchronous gather at 1 MiB, the one cell of run_every_verb.sh's single run
# above 1.05x (1.12x in place, 0.88x before): three runs per tree, alternately, 50 iterations
# a round, 21 rounds, as run_1m.sh in the board-kept folder. JSON in impi-gather-1m/<tree>/.
HERE=$(cd "$(dirname "$0")" && pwd); TREE=$(cd "$HERE/../../.." && pwd)
BEFORE=${1:?usage: run_gather_1m.sh BEFORE_TREE [VENV_DIR]}; V=${2:-$TREE}
for run in 1 2 3; do
  for tree in "$BEFORE" "$TREE"; do
    D=$HERE/impi-gather-1m/$(basename "$tree"); mkdir -p "$D"; cd "$tree" || exit 1
    timeout 300 "$V/.venv-impi/bin/mpiexec" -n 2 "$V/.venv-impi/bin/python" -m benchmarks.collective \
      --op gather -b 1M -e 1M -n 50 --baseline mpi4py --rounds 21 --json "$D/run$run.json" > /dev/null
  done
done
for tree in "$BEFORE" "$TREE"; do
  python3 - "$HERE/impi-gather-1m/$(basename "$tree")" <<'PY'
import json, pathlib, sys
d = pathlib.Path(sys.argv[1])
for p in ("out_of_place", "in_place"):
    print(d.name, p, [round(json.loads(f.read_text())["rows"][0]["ratio"][p], 2) for f in sorted(d.glob("run*.json"))])
PY
done
