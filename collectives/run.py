"""``python -m collectives.run``: a job that outlives a host. A thin wrapper over the MPI's
own launcher (as torchrun is to ``torch.distributed``): it starts the job with that launcher
on the hosts given; when the job fails it probes the hosts through the launcher's remote
shell, and starts the job again on those that answer, with the command's resume flag, until
it succeeds, no restart is left or fewer than ``--min-hosts`` hosts remain. Then it prints a
summary and leaves with the job's exit code. docs/elastic.md says more.

    python -m collectives.run --hosts a:2,b:2,c:2 --max-restarts 2 --min-hosts 2 \\
        --resume-arg "--resume ckpt" -- \\
        python examples/gpt_3d.py --dp {nodes} --tp 2 --zero 1 --save ckpt --save-every 4

The command line is checked before anything is launched:

>>> main(["--hosts", "localhost", "--launcher", "no-such-mpiexec", "--", "python", "train.py"])
Traceback (most recent call last):
...
collectives._errors.InvalidArgumentError: --launcher no-such-mpiexec: no such program
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from ._errors import InvalidArgumentError
from ._launch.hosts import Host, parse_hosts, read_hostfile
from ._launch.launcher import (
    find_launcher,
    find_remote_shell,
    launch_command,
    launcher_environment,
    mpi_family,
    unreachable,
    write_machinefile,
)
from ._launch.supervise import Ended, job_command, summary, supervise
from ._launch.watch import Stop, run_watched

#: the variable that tells every rank which run of the job it is in (0: the first)
RESTART_VARIABLE = "COLLECTIVES_RESTART_COUNT"


@dataclass
class Options:
    """The command line, checked: what :func:`main` runs."""

    hosts: list[Host]
    command: list[str]
    resume: list[str]
    max_restarts: int
    min_hosts: int
    launcher: str
    family: str
    remote_shell: str
    launcher_options: list[str]
    probe_timeout: float
    watch: float
    grace: float


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m collectives.run",
        description="Run an MPI job on the given hosts with the MPI's own launcher; when it "
        "fails, run it again on the hosts that remain, with the resume flag.",
        epilog="In the command and the resume flag, {nodes} is the number of hosts of the "
        "run, {size} its number of ranks, {restart} the restart's number (0: the first "
        f"run); every rank also has {RESTART_VARIABLE}.",
    )
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--hosts", help="host[:ranks],... e.g. a:2,b:2")
    where.add_argument("--hostfile", help="a file of one host a line: name, name:n or name slots=n")
    p.add_argument("--ranks-per-host", type=int, default=1, metavar="N",
                   help="ranks of a host written without a count (default 1)")  # fmt: skip
    p.add_argument("--max-restarts", type=int, default=0, metavar="N",
                   help="runs of the job after the first (default 0)")  # fmt: skip
    p.add_argument("--min-hosts", type=int, default=1, metavar="N",
                   help="stop when fewer hosts remain (default 1)")  # fmt: skip
    p.add_argument("--resume-arg", default="", metavar="ARGS",
                   help='added to the command on every restart, e.g. "--resume ckpt" (one '
                   "word: --resume-arg=--resume-latest)")  # fmt: skip
    p.add_argument("--launcher", help="the MPI's launcher (default: the mpiexec beside this "
                   "Python, else on PATH)")  # fmt: skip
    p.add_argument("--launcher-args", default="", metavar="ARGS",
                   help="more options of the launcher, put before the command")  # fmt: skip
    p.add_argument("--remote-shell", default="ssh", metavar="PROGRAM",
                   help="how the launcher and the probe reach a host (default ssh)")  # fmt: skip
    p.add_argument("--probe-timeout", type=float, default=10.0, metavar="S",
                   help="seconds a host has to answer the probe (default 10)")  # fmt: skip
    p.add_argument("--watch", type=float, default=10.0, metavar="S",
                   help="probe the hosts every S seconds while the job runs (0: only after "
                   "each run; default 10)")  # fmt: skip
    p.add_argument("--grace", type=float, default=30.0, metavar="S",
                   help="seconds the launcher may run on after a host stopped answering "
                   "(default 30)")  # fmt: skip
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the training command")
    return p


def parse(argv: Optional[Sequence[str]] = None) -> Options:
    """The checked options of a command line; :class:`InvalidArgumentError` names the first
    thing wrong, before anything is launched.

    >>> parse(["--hosts", "a:2,b:2", "--min-hosts", "3", "--", "python", "train.py"])
    Traceback (most recent call last):
    ...
    collectives._errors.InvalidArgumentError: --min-hosts 3: more than the 2 hosts given
    """
    args = parser().parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise InvalidArgumentError("no command: put the training command after --")
    if args.ranks_per_host < 1:
        raise InvalidArgumentError(f"--ranks-per-host {args.ranks_per_host}, expected >= 1")
    if args.hosts is not None:
        hosts = parse_hosts(args.hosts, args.ranks_per_host)
    else:
        hosts = read_hostfile(args.hostfile, args.ranks_per_host)
    if args.max_restarts < 0:
        raise InvalidArgumentError(f"--max-restarts {args.max_restarts}, expected >= 0")
    if not 1 <= args.min_hosts <= len(hosts):
        more = f"more than the {len(hosts)} hosts given" if args.min_hosts > 0 else "expected >= 1"
        raise InvalidArgumentError(f"--min-hosts {args.min_hosts}: {more}")
    for name in ("probe_timeout", "watch", "grace"):
        value = getattr(args, name)
        if not value >= 0 or (name == "probe_timeout" and value == 0):
            flag = "--" + name.replace("_", "-")
            raise InvalidArgumentError(f"{flag} {value}, expected a number of seconds > 0")
    resume = _words(args.resume_arg, "--resume-arg")
    if resume and args.max_restarts == 0:
        raise InvalidArgumentError("--resume-arg without --max-restarts: it would never be used")
    launcher = find_launcher(args.launcher)
    return Options(
        hosts=hosts,
        command=command,
        resume=resume,
        max_restarts=args.max_restarts,
        min_hosts=args.min_hosts,
        launcher=launcher,
        family=mpi_family(launcher),
        remote_shell=find_remote_shell(args.remote_shell),
        launcher_options=_words(args.launcher_args, "--launcher-args"),
        probe_timeout=args.probe_timeout,
        watch=args.watch,
        grace=args.grace,
    )


def _words(text: str, flag: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as error:
        raise InvalidArgumentError(f"{flag} {text!r}: {error}") from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the job of command line ``argv`` (default: this process's) with restarts; returns
    the job's exit code."""
    options = parse(argv)
    stop = Stop()
    if argv is None:
        stop.install()
    env = launcher_environment(os.environ)

    def say(line: str) -> None:
        print(f"collectives.run: {line}", file=sys.stderr, flush=True)

    def find_gone(hosts: list[Host]) -> list[str]:
        return unreachable(hosts, options.remote_shell, options.probe_timeout)

    def run(hosts: list[Host], restart: int) -> Ended:
        program = job_command(options.command, options.resume, hosts, restart)
        machinefile = None
        if options.family == "impi":
            machinefile = write_machinefile(hosts, Path(scratch) / f"hosts-{restart}")
        argv = launch_command(
            options.family, options.launcher, hosts, program,
            remote_shell=options.remote_shell, env={RESTART_VARIABLE: str(restart)},
            options=options.launcher_options, machinefile=machinefile,
        )  # fmt: skip
        return run_watched(
            argv, {**env, RESTART_VARIABLE: str(restart)}, hosts, find_gone,
            watch=options.watch, grace=options.grace, stop=stop, say=say,
        )  # fmt: skip

    with tempfile.TemporaryDirectory(prefix="collectives-run-") as scratch:
        outcome = supervise(
            options.hosts, run, find_gone, max_restarts=options.max_restarts,
            min_hosts=options.min_hosts, interrupted=lambda: stop.requested, say=say,
        )  # fmt: skip
    if outcome.stopped is not None or len(outcome.attempts) > 1:
        print(summary(outcome), file=sys.stderr, flush=True)
    return outcome.returncode


def _cli() -> int:
    try:
        return main()
    except InvalidArgumentError as error:
        parser().error(str(error))  # exits 2 with the usage line, as argparse's own errors
        raise  # pragma: no cover


if __name__ == "__main__":
    sys.exit(_cli())
