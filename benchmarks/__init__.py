"""Benchmarks of the collectives layer, run side by side with the raw libraries.

The main one measures every collective the way nccl-tests does::

    mpiexec -n 4 python -m benchmarks.collective --op all_reduce -b 8 -e 128M -f 2

See ``benchmarks/README.md`` for every flag and what the columns mean, and
``docs/performance.md`` for the measured tables.
"""
