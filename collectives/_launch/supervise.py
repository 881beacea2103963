"""The restart loop of ``python -m collectives.run``: run the job, and when it fails, drop
the hosts that are gone and run it again on the others with the resume flag, until it
succeeds, no restart is left or too few hosts remain. It knows neither MPI nor processes:
the caller hands it the function that runs one attempt and the one that finds lost hosts.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable, Optional

from .hosts import Host


@dataclass(frozen=True)
class Ended:
    """How one run of the job ended: the launcher's exit code (128 + N for signal N), and
    the hosts seen gone while it ran (by the watch), in the order they were seen."""

    returncode: int
    lost: tuple[str, ...] = ()


@dataclass
class Attempt:
    """One run of the job: its restart number (0: the first run), hosts, how it ended, the
    hosts found gone after it and how long it ran (seconds)."""

    restart: int
    hosts: list[Host]
    ended: Ended
    gone: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def succeeded(self) -> bool:
        return self.ended.returncode == 0 and not self.gone


@dataclass
class Outcome:
    """What :func:`supervise` did: every attempt, why it stopped short of success (None when
    the last attempt succeeded) and the exit code to leave with."""

    attempts: list[Attempt]
    stopped: Optional[str]
    returncode: int


def job_command(
    command: Sequence[str], resume: Sequence[str], hosts: Sequence[Host], restart: int
) -> list[str]:
    """The command of an attempt: ``command``, then ``resume`` on a restart, with ``{nodes}``
    (the number of hosts), ``{size}`` (of ranks) and ``{restart}`` filled in.

    >>> hosts = [Host("a", 2), Host("b", 2)]
    >>> job_command(["train.py", "--dp", "{nodes}"], ["--resume", "ckpt"], hosts, restart=0)
    ['train.py', '--dp', '2']
    >>> job_command(["train.py", "--dp", "{nodes}"], ["--resume", "ckpt"], hosts, restart=1)
    ['train.py', '--dp', '2', '--resume', 'ckpt']
    """
    values = {
        "{nodes}": str(len(hosts)),
        "{size}": str(sum(h.slots for h in hosts)),
        "{restart}": str(restart),
    }
    words = [*command, *(resume if restart else ())]
    out = []
    for word in words:
        for placeholder, value in values.items():
            word = word.replace(placeholder, value)
        out.append(word)
    return out


def supervise(
    hosts: Sequence[Host],
    run: Callable[[list[Host], int], Ended],
    find_gone: Callable[[list[Host]], list[str]],
    *,
    max_restarts: int,
    min_hosts: int = 1,
    interrupted: Callable[[], bool] = lambda: False,
    say: Callable[[str], None] = lambda line: None,
    clock: Callable[[], float] = time.monotonic,
) -> Outcome:
    """Run the job (``run(hosts, restart)``) until it succeeds or must stop.

    After every run, the hosts gone are those the watch saw go while it ran and those
    ``find_gone(hosts)`` finds after it; a run failed if its launcher's exit code is not 0
    or a host is gone (Open MPI's launcher exits 0 when it loses a host). The next run has the others; the loop stops when ``max_restarts``
    restarts are spent, fewer than ``min_hosts`` hosts remain or ``interrupted()``.
    ``say(line)`` tells of each restart before it starts.

    >>> down = set()
    >>> def run(hosts, restart):            # host c goes down during the first run
    ...     if restart == 0:
    ...         down.add("c")
    ...         return Ended(137)
    ...     return Ended(0)
    >>> outcome = supervise([Host("a", 2), Host("b", 2), Host("c", 2)], run,
    ...                     lambda hosts: [h.name for h in hosts if h.name in down],
    ...                     max_restarts=2)
    >>> [(a.restart, len(a.hosts), a.ended.returncode, a.gone) for a in outcome.attempts]
    [(0, 3, 137, ['c']), (1, 2, 0, [])]
    >>> outcome.stopped, outcome.returncode
    (None, 0)
    """
    attempts: list[Attempt] = []
    current = list(hosts)
    for restart in range(max_restarts + 1):
        started = clock()
        ended = run(current, restart)
        attempt = Attempt(restart, current, ended, seconds=clock() - started)
        attempts.append(attempt)
        found = find_gone(current) if not interrupted() else []
        attempt.gone = [h.name for h in current if h.name in {*ended.lost, *found}]
        if attempt.succeeded:
            return Outcome(attempts, None, 0)
        # a launcher that said 0 but lost a host did not finish the job
        returncode = ended.returncode or 1
        current = [h for h in current if h.name not in attempt.gone]
        if interrupted():
            return Outcome(attempts, "interrupted", returncode)
        if restart == max_restarts:
            return Outcome(attempts, f"no restart left (--max-restarts {max_restarts})", returncode)
        if len(current) < min_hosts:
            left = f"{len(current)} host{'s' * (len(current) != 1)} left"
            return Outcome(attempts, f"{left}, fewer than --min-hosts {min_hosts}", returncode)
        gone = ", ".join(attempt.gone) or "none"
        say(
            f"the job ended with exit code {ended.returncode}, hosts gone: {gone}; restart "
            f"{restart + 1} of {max_restarts} on {','.join(str(h) for h in current)}"
        )
    raise AssertionError("unreachable: the last restart returns")  # pragma: no cover


def summary(outcome: Outcome, width: int = 100) -> str:
    """The one-screen account of a job that failed or was restarted: a line per attempt
    (the first 3 and last 8 of many), why it stopped, and a note where a launcher exited 0
    having lost a host.

    >>> a = Attempt(0, [Host("a", 2), Host("b", 2)], Ended(137), gone=["b"], seconds=12.25)
    >>> b = Attempt(1, [Host("a", 2)], Ended(1), seconds=3.5)
    >>> print(summary(Outcome([a, b], "no restart left (--max-restarts 1)", 1)))
    collectives.run: the job failed (exit code 1): no restart left (--max-restarts 1)
      restart  exit  ran (s)  ranks  hosts gone  hosts
            0   137     12.2      4  b           a:2,b:2
            1     1      3.5      2  -           a:2
    """
    if outcome.stopped is None:
        restarts = len(outcome.attempts) - 1
        head = f"collectives.run: the job succeeded after {restarts} restart{'s' * (restarts != 1)}"
    else:
        head = (
            f"collectives.run: the job failed (exit code {outcome.returncode}): {outcome.stopped}"
        )
    lines = [head, "  restart  exit  ran (s)  ranks  hosts gone  hosts"]
    shown: list[Optional[Attempt]] = list(outcome.attempts)
    if len(shown) > 11:
        shown = [*shown[:3], None, *shown[-8:]]
    for attempt in shown:
        if attempt is None:
            lines.append("      ...")
            continue
        gone = ",".join(attempt.gone) or "-"
        row = (
            f"  {attempt.restart:7d}  {attempt.ended.returncode:4d}  {attempt.seconds:7.1f}  "
            f"{sum(h.slots for h in attempt.hosts):5d}  {gone:<10}  "
        )
        where = ",".join(str(h) for h in attempt.hosts)
        room = max(width - len(row), 12)
        if len(where) > room:
            where = where[: room - 3] + "..."
        lines.append(row + where)
    if any(a.ended.returncode == 0 and a.gone for a in outcome.attempts):
        lines.append(
            "  (exit 0 with a host gone: the launcher lost a host and said 0, as Open MPI's does)"
        )
    return "\n".join(lines)
