"""The hosts of a job and the ranks each runs: ``--hosts a:2,b:2`` or a host file."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from .._errors import InvalidArgumentError

_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


@dataclass(frozen=True)
class Host:
    """A host of the job and the number of ranks it runs.

    >>> Host("node1", 2)
    Host(name='node1', slots=2)
    """

    name: str
    slots: int

    def __str__(self) -> str:
        return f"{self.name}:{self.slots}"


def parse_hosts(spec: str, ranks_per_host: int = 1) -> list[Host]:
    """Hosts from ``"a:2,b:2"``; a host written without ``:n`` runs ``ranks_per_host`` ranks.

    >>> parse_hosts("a:2,b")
    [Host(name='a', slots=2), Host(name='b', slots=1)]
    >>> parse_hosts("a,a")
    Traceback (most recent call last):
    ...
    collectives._errors.InvalidArgumentError: --hosts: host a is named twice
    """
    entries = [e.strip() for e in spec.split(",")]
    if not spec.strip() or "" in entries:
        raise InvalidArgumentError(f"--hosts {spec!r}: expected host[:ranks],host[:ranks],...")
    hosts = [_host(e, ranks_per_host, "--hosts") for e in entries]
    return _checked(hosts, ["--hosts"] * len(hosts))


def read_hostfile(path: str | Path, ranks_per_host: int = 1) -> list[Host]:
    """Hosts from a file of one host a line, written ``name``, ``name:n`` or Open MPI's
    ``name slots=n``; ``#`` starts a comment.

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("w", suffix=".hosts", delete=False) as f:
    ...     _ = f.write("# the rack\\na slots=2\\nb:2\\nc\\n")
    >>> read_hostfile(f.name, ranks_per_host=4)
    [Host(name='a', slots=2), Host(name='b', slots=2), Host(name='c', slots=4)]
    >>> os.unlink(f.name)
    """
    where = f"--hostfile {path}"
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise InvalidArgumentError(f"{where}: cannot be read ({error.strerror})") from None
    hosts, wheres = [], []
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        entry = words[0]
        if len(words) == 2 and words[1].startswith("slots=") and ":" not in entry:
            entry += ":" + words[1][len("slots=") :]
        elif len(words) > 1:
            raise InvalidArgumentError(
                f"{where}, line {number}: {line.strip()!r}, expected name, name:n or name slots=n"
            )
        wheres.append(f"{where}, line {number}")
        hosts.append(_host(entry, ranks_per_host, wheres[-1]))
    if not hosts:
        raise InvalidArgumentError(f"{where}: names no host")
    return _checked(hosts, wheres)


def _host(entry: str, ranks_per_host: int, where: str) -> Host:
    name, colon, count = entry.rpartition(":") if ":" in entry else (entry, "", "")
    if not _NAME.fullmatch(name):
        raise InvalidArgumentError(f"{where}: {entry!r} is no host name")
    if not colon:
        return Host(name, ranks_per_host)
    if not count.isdigit() or int(count) < 1:
        raise InvalidArgumentError(f"{where}: {entry!r}, expected host:n with n >= 1 ranks")
    return Host(name, int(count))


def _checked(hosts: list[Host], wheres: list[str]) -> list[Host]:
    """``hosts``, each named once (``wheres``: where each was read, for the error)."""
    seen: set[str] = set()
    for host, where in zip(hosts, wheres):
        if host.name in seen:
            raise InvalidArgumentError(f"{where}: host {host.name} is named twice")
        seen.add(host.name)
    return hosts
