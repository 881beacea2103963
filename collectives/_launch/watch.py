"""One run of the job: the launcher as a child process, and a watch that probes the hosts
while it runs.

A launcher may outlive the loss of a host: Open MPI's and Intel MPI's hang when a link to a
host is cut, though every rank ended. So a host that stops answering the probe is given
``grace`` seconds for the launcher to end by itself; then the launcher is sent SIGTERM, and
SIGKILL 5 s later (Open MPI's prterun, its link to a host cut, ignores SIGTERM).

The launcher runs in a process group of its own, with what it starts on this host (Open
MPI's prterun runs this host's ranks itself): once the launcher has ended, whatever is left
in the group is killed, so that no rank of the run outlives it here (holding a GPU the next
run needs). The launcher's daemons on other hosts end their ranks when they lose it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Callable

from .hosts import Host
from .supervise import Ended

#: seconds between SIGTERM and SIGKILL for a launcher that is ended
_KILL_AFTER = 5.0


class Stop:
    """Set by SIGINT or SIGTERM to this process: the job's launcher is sent the signal and
    no restart follows.

    >>> stop = Stop()
    >>> stop.requested
    False
    """

    def __init__(self) -> None:
        self.requested = False
        self._launcher: subprocess.Popen[bytes] | None = None

    def install(self) -> None:
        """Take SIGINT and SIGTERM (in the main thread) for as long as this process lives."""
        signal.signal(signal.SIGINT, self._handle)
        signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        self.requested = True
        launcher = self._launcher
        if launcher is not None and launcher.poll() is None:
            launcher.send_signal(signum)


def run_watched(
    argv: Sequence[str],
    env: Mapping[str, str],
    hosts: Sequence[Host],
    find_gone: Callable[[list[Host]], list[str]],
    *,
    watch: float,
    grace: float,
    stop: Stop,
    say: Callable[[str], None] = lambda line: None,
) -> Ended:
    """Run ``argv`` (the launcher) to its end; every ``watch`` seconds (0: never) probe
    ``hosts`` with ``find_gone``; end a launcher that runs on ``grace`` seconds after a host
    was found gone. The exit code of a launcher ended by signal N is 128 + N, as a shell's.

    >>> import sys
    >>> run_watched([sys.executable, "-c", "raise SystemExit(3)"], {}, [], lambda hosts: [],
    ...             watch=0, grace=0, stop=Stop())
    Ended(returncode=3, lost=())
    """
    launcher = subprocess.Popen(list(argv), env=dict(env), start_new_session=True)
    stop._launcher = launcher
    lost: list[str] = []
    first_lost = [0.0]
    finished = threading.Event()

    def probe() -> None:
        while not finished.wait(watch):
            gone = [g for g in find_gone(list(hosts)) if g not in lost]
            if gone and not finished.is_set():
                lost.extend(gone)
                first_lost[0] = first_lost[0] or time.monotonic()
                say(f"host{'s' * (len(gone) > 1)} {', '.join(gone)} stopped answering the probe")

    watcher = threading.Thread(target=probe, name="collectives.run watch", daemon=True)
    if watch > 0 and hosts:
        watcher.start()
    terminated = killed = False
    try:
        while True:
            try:
                code = launcher.wait(timeout=0.1)
                break
            except subprocess.TimeoutExpired:
                pass
            since = time.monotonic() - first_lost[0] if first_lost[0] else -1.0
            if since > grace and not terminated:
                say(f"the launcher runs on {grace:g} s after a host was lost: sent SIGTERM")
                launcher.terminate()
                terminated = True
            elif since > grace + _KILL_AFTER and not killed:
                say("the launcher runs on after SIGTERM: sent SIGKILL")
                launcher.kill()
                killed = True
    finally:
        finished.set()
        stop._launcher = None
        if launcher.poll() is None:  # this process is being interrupted: leave nothing behind
            launcher.kill()
            launcher.wait()
        _kill_group(launcher.pid)
    return Ended(128 - code if code < 0 else code, tuple(lost))


def _kill_group(group: int) -> None:
    """SIGKILL whatever is left in process group ``group``."""
    try:
        os.killpg(group, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # nothing left
