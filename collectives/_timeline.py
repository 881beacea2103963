"""An opt-in Chrome-trace timeline: ``COLLECTIVES_TIMELINE=path`` before the first ``init``.

Each rank writes ``path.rank<r>.json`` at exit (one process per rank, one track per
communicator, plus named tracks such as DDP's buckets); ``python -m collectives.timeline
merge`` joins the files into one trace for chrome://tracing or Perfetto.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from typing import Any

from mpi4py import MPI


class Timeline:
    """Collects complete-events ("ph": "X") in memory and writes them at exit."""

    def __init__(self, path: str):
        self.rank = MPI.COMM_WORLD.Get_rank()
        self.path = f"{path}.rank{self.rank}.json"
        self.events: list[dict] = []
        self.tracks: dict[str, int] = {}
        self.lock = threading.Lock()
        atexit.register(self.write)

    def track(self, name: str) -> int:
        with self.lock:
            return self.tracks.setdefault(name, len(self.tracks) + 1)

    def span(self, track: str | int, name: str, start: float, end: float, **args: Any) -> None:
        """One bar from ``start`` to ``end`` (``time.monotonic()`` seconds) on ``track``."""
        tid = track if isinstance(track, int) else self.track(track)
        event = {
            "name": name,
            "ph": "X",
            "pid": self.rank,
            "tid": tid,
            "ts": start * 1e6,
            "dur": max(end - start, 0.0) * 1e6,
            "args": args,
        }
        with self.lock:
            self.events.append(event)

    def pending(self, pending: Any, track: int) -> None:
        self.span(
            track,
            pending.call,
            pending.start,
            pending.end or time.monotonic(),
            seq=pending.seq,
            bytes=pending.nbytes,
            state=pending.state,
        )

    def write(self) -> None:
        meta = [
            {
                "name": "process_name",
                "ph": "M",
                "pid": self.rank,
                "args": {"name": f"rank {self.rank}"},
            }
        ]
        meta += [
            {"name": "thread_name", "ph": "M", "pid": self.rank, "tid": tid, "args": {"name": name}}
            for name, tid in self.tracks.items()
        ]
        with self.lock, open(self.path, "w") as f:
            json.dump({"traceEvents": meta + self.events, "displayTimeUnit": "ms"}, f)


#: the timeline being recorded, from the first ``init`` (:func:`start`), or None
TIMELINE: Timeline | None = None


def start() -> None:
    """Start recording where ``COLLECTIVES_TIMELINE`` asks (once): by ``init``, not at
    import, which must register no exit handler."""
    global TIMELINE
    path = os.environ.get("COLLECTIVES_TIMELINE")
    if TIMELINE is None and path:
        TIMELINE = Timeline(path)


def span(track: str, name: str, start: float, end: float, **args: Any) -> None:
    """Add a bar to the timeline when one is being recorded (otherwise nothing).

    Example: ``span("ddp", "bucket 3", t0, time.monotonic(), bytes=nbytes)``.
    """
    if TIMELINE is not None:
        TIMELINE.span(track, name, start, end, **args)


def merge(paths: list[str], out: str) -> int:
    """Join per-rank trace files into one; returns the number of events written."""
    events: list[dict] = []
    for path in paths:
        with open(path) as f:
            events.extend(json.load(f)["traceEvents"])
    with open(out, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)
    return len(events)
