"""nccl-tests' own JSON output (``-J PATH``), in its layout, for the tools that read it.

nccl-tests (v2.19.6, ``src/util.cu``) writes JSON only when the name ends in ``.json``,
never overwrites a file (it opens with ``"wx"`` and falls back to ``PATH.0``, ``PATH.1``...)
and writes, on rank 0: ``version`` (3), ``start_time``, ``args``, ``env``, ``nccl_version``,
``config`` (with a ``devices`` list), ``results`` (one object per row), ``out_of_bounds``,
``average_bus_bandwidth``, ``errors`` and ``end_time``. Its own types are kept: the row's
``root`` is the ``%6i`` string of the table, booleans are the strings ``"true"`` and
``"false"``, a NaN is the string ``"nan"``, ``nwrong`` is a number or null.

Unlike nccl-tests, which streams one document and closes it at the end, the file here is
rewritten whole (atomically) after every row: a run stopped mid-sweep leaves a valid JSON
document holding every row it measured (with no ``end_time``).

Example:
    >>> path, line = claim("run.json")  # "# Writing JSON output to run.json"
    >>> out = NcclTestsJson(path, ["all_reduce_perf", "-J", "run.json"], nccl_version=0)
    >>> out.config(args, where); out.add(row, args); out.finish(totals, None)
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from ._report import atomic_write
from ._sizes import DEFAULT_STEP
from ._table import PLACEMENTS, TIMESTAMP

JSON_FILE_VERSION = 3


def wants_json(path: str) -> bool:
    """nccl-tests' ``classifyOutputFile``: the extension after the last ``.`` (with no
    ``/`` after it) is ``json``, in any case.

    Example:
        >>> wants_json("out.JSON"), wants_json("out.txt"), wants_json("dir.json/out")
        (True, False, False)
    """
    dot, slash = path.rfind("."), path.rfind("/")
    return dot > slash and dot + 1 < len(path) and path[dot + 1 :].lower() == "json"


def claim(path: str) -> tuple[str | None, str]:
    """Create the output file without overwriting any (``PATH``, else ``PATH.0``,
    ``PATH.1``...), as nccl-tests: (the path taken or None, the line to print)."""
    if not wants_json(path):
        # nccl-tests writes nothing and says nothing; the line tells why no file appears
        return None, f"# skipping json output; {path} does not end in .json"
    tried, n = path, 0
    while True:
        try:
            with open(tried, "x"):
                return tried, f"# Writing JSON output to {tried}"
        except FileExistsError:
            tried, n = f"{path}.{n}", n + 1
        except OSError:
            return None, f"# skipping json output; {tried} not accessible"


def _now() -> str:
    return time.strftime(TIMESTAMP)


def _double(value: float) -> float | str:
    return "nan" if math.isnan(value) else float(value)


def _bool(value: bool) -> str:
    return "true" if value else "false"


class NcclTestsJson:
    """One run's nccl-tests JSON document at ``path``, saved after every change."""

    def __init__(self, path: str, argv: list[str], nccl_version: int):
        self.path = path
        self.doc: dict[str, Any] = {
            "version": JSON_FILE_VERSION,
            "start_time": _now(),
            "args": list(argv),
            "env": [f"{k}={v}" for k, v in os.environ.items()],
            "nccl_version": nccl_version,
        }
        self._save()

    def _save(self) -> None:
        atomic_write(self.path, _dumps(self.doc))

    def config(self, args: Any, where: list[tuple]) -> None:
        """nccl-tests' ``config``: the run's settings and one object per rank's device line
        (``where``: rank, pid, host, device, PCI id, name); then an empty ``results``."""
        config: dict[str, Any] = {
            "nthreads": 1,
            "ngpus": 1,
            "minimum_bytes": args.minbytes,
            "maximum_bytes": args.maxbytes,
        }
        if args.factor > 1:
            config["step_factor"] = args.factor
        else:
            config["step_bytes"] = args.stepbytes or DEFAULT_STEP
        config.update(
            warmup_iters=args.warmup_iters,
            iterations=args.iters,
            aggregated_iterations=args.agg_iters,
            validation=args.check,
            graph=0,
            blocking_collectives=_bool(args.blocking),
            per_iter_timing=_bool(False),
            per_iter_skip=0,
            parallel_init=_bool(args.parallel_init),
        )
        config["devices"] = [
            {"rank": rank, "group": 0, "pid": pid, "hostname": host.split()[0] if host else "",
             "device": device, "device_hex": bus, "device_info": name}
            for rank, pid, host, device, bus, name in where
        ]  # fmt: skip
        self.doc["config"] = config
        self.doc["results"] = []
        self._save()

    def add(self, row: dict[str, Any], args: Any) -> None:
        """One row, as nccl-tests' ``writeBenchmarkLine*``: ours, never the baseline's."""
        result: dict[str, Any] = {
            "size": row["size"],
            "count": row["count"],
            "type": row["type"],
            "redop": row["redop"],
            "root": "%6i" % row["root"],  # noqa: UP031 (nccl-tests' own format)
        }
        time_key = "cpu_time" if args.report_cputime else "time"
        for placement in PLACEMENTS:
            cell = row[placement]
            result[placement] = None if cell is None else {
                time_key: _double(cell["time_us"]),
                "alg_bw": _double(cell["algbw"]),
                "bus_bw": _double(cell["busbw"]),
                "nwrong": None if cell["wrong"] is None else float(cell["wrong"]),
            }  # fmt: skip
        result["actual_iterations"] = args.iters
        result["experiment_name"] = ""
        self.doc.setdefault("results", []).append(result)
        self._save()

    def finish(self, totals: dict[str, Any], min_bw: float | None) -> None:
        """The closing objects (``out_of_bounds``, ``average_bus_bandwidth``, ``errors``)
        and ``end_time``; ``min_bw``: ``NCCL_TESTS_MIN_BW`` if set."""
        self.doc.setdefault("results", [])
        self.doc["out_of_bounds"] = {
            "count": totals["failed"],
            "okay": _bool(totals["failed"] == 0),
        }
        avg = totals["avg_busbw"]
        self.doc["average_bus_bandwidth"] = {
            "bandwidth": _double(avg),
            "okay": "unchecked" if min_bw is None else _bool(avg >= min_bw * 0.9),
        }
        # nccl-tests writes ncclGetLastError's text, "" when there was none
        self.doc["errors"] = [""]
        self.doc["end_time"] = _now()
        self._save()


def _dumps(doc: dict[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"))
