"""nccl-tests' all_reduce_perf, with its flags, defaults and output (see benchmarks/README.md).

Example:
    $ mpiexec -n 2 python -m benchmarks.all_reduce_perf -b 8 -e 1M -f 4
"""

import sys

from .collective import main

if __name__ == "__main__":
    sys.exit(main(collective="all_reduce"))
