"""``python -m collectives.run`` with a fake launcher and remote shell (``tests/elastic/``):
which hosts each run gets, the resume flag, the stops and the summary, the bad arguments.
The wrapper runs in this process (``main``), but where its command line or signals are
tested; no MPI job runs (``test_run_nodes.py`` runs real ones)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from collectives import InvalidArgumentError
from collectives._launch.hosts import Host, parse_hosts, read_hostfile
from collectives._launch.supervise import Attempt, Ended, Outcome, summary, supervise
from collectives.run import main, parse
from tests.spmd_launcher import REPO

FAKES = Path(__file__).resolve().parent / "elastic"
LAUNCHER = str(FAKES / "fake_mpiexec")
REMOTE_SHELL = str(FAKES / "fake_remote_shell")
COMMAND = ["--", "python", "train.py", "--dp", "{nodes}", "--size", "{size}"]


def wrapper_argv(folder: Path, *options: str, hosts: str = "a:2,b:2,c:2") -> list[str]:
    """The wrapper's options (after ``python -m collectives.run``) with the fakes."""
    return [
        "--hosts", hosts, "--launcher", str(folder / "mpiexec"), "--remote-shell", REMOTE_SHELL,
        "--probe-timeout", "5", *options, *COMMAND,
    ]  # fmt: skip


def write_script(folder: Path, script: list[str]) -> dict[str, str]:
    """The fake launcher (as ``folder/mpiexec``, run by this Python: an ``env python3`` may
    be a slow shim) and its script, one line a launch; the environment that finds them."""
    launcher = folder / "mpiexec"
    launcher.write_text(f"#!{sys.executable}\n" + Path(LAUNCHER).read_text())
    launcher.chmod(0o755)
    (folder / "script").write_text("".join(line + "\n" for line in script))
    return {"FAKE_HOSTS_DIR": str(folder)}


@dataclass
class Done:
    returncode: int
    stderr: str  # the wrapper's and the launcher's


@pytest.fixture
def run_wrapper(monkeypatch, capfd):
    """Run the wrapper in this process (``main``) to its end: (how it ended, its launches)."""

    def run(folder: Path, script: list[str], *options: str, **kw) -> tuple[Done, list[dict]]:
        for name, value in write_script(folder, script).items():
            monkeypatch.setenv(name, value)
        capfd.readouterr()
        returncode = main(wrapper_argv(folder, *options, **kw))
        return Done(returncode, capfd.readouterr().err), launches(folder)

    return run


def launches(folder: Path) -> list[dict]:
    log = folder / "launches"
    return [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []


def program(launch: dict) -> list[str]:
    """The training command of a launch (what follows the launcher's options)."""
    argv = launch["argv"]
    return argv[argv.index("python") :]


def test_a_lost_host_is_dropped_and_the_job_resumes_on_the_others(tmp_path, run_wrapper):
    done, made = run_wrapper(
        tmp_path, ["down c exit 137", "exit 0"], "--max-restarts", "2",
        "--resume-arg", "--resume ckpt", "--watch", "0",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(made) == 2
    first, second = made
    assert first["argv"][:7] == ["-launcher", "ssh", "-launcher-exec", REMOTE_SHELL,
                                 "-hosts", "a:2,b:2,c:2", "-n"]  # fmt: skip
    assert program(first) == ["python", "train.py", "--dp", "3", "--size", "6"]
    assert first["restart"] == "0"
    assert "a:2,b:2" in second["argv"] and "4" in second["argv"]
    assert program(second) == ["python", "train.py", "--dp", "2", "--size", "4",
                               "--resume", "ckpt"]  # fmt: skip
    assert second["restart"] == "1"
    assert "the job ended with exit code 137, hosts gone: c; restart 1 of 2" in done.stderr
    assert "the job succeeded after 1 restart" in done.stderr


def test_a_job_that_succeeds_at_once_prints_nothing_of_the_wrapper(tmp_path, run_wrapper):
    done, made = run_wrapper(tmp_path, ["exit 0"], "--max-restarts", "2", "--watch", "0")
    assert (done.returncode, done.stderr, len(made)) == (0, "", 1)


def test_a_failure_with_every_host_alive_restarts_on_all_of_them(tmp_path, run_wrapper):
    done, made = run_wrapper(tmp_path, ["exit 1", "exit 0"], "--max-restarts", "1", "--watch", "0")
    assert done.returncode == 0, done.stderr
    assert [m["argv"][5] for m in made] == ["a:2,b:2,c:2", "a:2,b:2,c:2"]
    assert "hosts gone: none" in done.stderr


def test_no_restart_left_ends_with_the_jobs_exit_code_and_a_summary(tmp_path, run_wrapper):
    done, made = run_wrapper(tmp_path, ["exit 1", "exit 3"], "--max-restarts", "1", "--watch", "0")
    assert done.returncode == 3
    assert len(made) == 2
    lines = done.stderr.splitlines()
    at = lines.index("collectives.run: the job failed (exit code 3): no restart left "
                     "(--max-restarts 1)")  # fmt: skip
    rows = [line.split() for line in lines[at + 2 : at + 4]]
    assert [(r[0], r[1], r[3], r[4], r[5]) for r in rows] == [
        ("0", "1", "6", "-", "a:2,b:2,c:2"), ("1", "3", "6", "-", "a:2,b:2,c:2"),
    ]  # fmt: skip


def test_too_few_hosts_left_stops_before_relaunching(tmp_path, run_wrapper):
    done, made = run_wrapper(
        tmp_path, ["down b exit 137"], "--max-restarts", "3", "--min-hosts", "3", "--watch", "0"
    )
    assert done.returncode == 137
    assert len(made) == 1
    assert "(exit code 137): 2 hosts left, fewer than --min-hosts 3" in done.stderr


def test_a_launcher_that_exits_0_having_lost_a_host_is_restarted(tmp_path, run_wrapper):
    """As Open MPI's launcher exits 0 when it loses a host: the probe after it finds out."""
    done, made = run_wrapper(
        tmp_path, ["down c exit 0", "exit 0"], "--max-restarts", "1", "--watch", "0"
    )
    assert done.returncode == 0, done.stderr
    assert "the job ended with exit code 0, hosts gone: c; restart 1 of 1" in done.stderr
    assert made[1]["argv"][5] == "a:2,b:2"


def test_the_watch_ends_a_launcher_that_outlives_a_lost_host(tmp_path, run_wrapper):
    """As Open MPI's and Intel MPI's launchers hang when a link is cut."""
    start = time.monotonic()
    done, made = run_wrapper(
        tmp_path, ["down c hang", "exit 0"], "--max-restarts", "1",
        "--watch", "0.2", "--grace", "0.5",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - start < 20
    assert "host c stopped answering the probe" in done.stderr
    assert "the launcher runs on 0.5 s after a host was lost: sent SIGTERM" in done.stderr
    assert "the job ended with exit code 143, hosts gone: c" in done.stderr
    assert made[1]["argv"][5] == "a:2,b:2"


def test_sigterm_to_the_wrapper_ends_the_job_with_no_restart(tmp_path):
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "collectives.run",
         *wrapper_argv(tmp_path, "--max-restarts", "3", "--watch", "0")],
        env={**os.environ, **write_script(tmp_path, ["hang"])}, cwd=REPO,
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while not launches(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.05)
    wrapper.send_signal(signal.SIGTERM)
    _, stderr = wrapper.communicate(timeout=30)
    assert wrapper.returncode == 143
    assert "the job failed (exit code 143): interrupted" in stderr
    assert len(launches(tmp_path)) == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--hosts", "a,b"], "no command: put the training command after --"),
        (["--hosts", "a:0,b", *COMMAND], "--hosts: 'a:0', expected host:n with n >= 1 ranks"),
        (["--hosts", "a,,b", *COMMAND], "--hosts 'a,,b': expected host[:ranks],host[:ranks]"),
        (["--hosts", "a b", *COMMAND], "--hosts: 'a b' is no host name"),
        (["--hostfile", "/no/such/file", *COMMAND], "--hostfile /no/such/file: cannot be read"),
        (["--hosts", "a", "--ranks-per-host", "0", *COMMAND], "--ranks-per-host 0, expected >= 1"),
        (["--hosts", "a", "--max-restarts", "-1", *COMMAND], "--max-restarts -1, expected >= 0"),
        (["--hosts", "a", "--min-hosts", "0", *COMMAND], "--min-hosts 0: expected >= 1"),
        (["--hosts", "a", "--watch", "-1", *COMMAND], "--watch -1.0, expected a number of"),
        (["--hosts", "a", "--probe-timeout", "0", *COMMAND], "--probe-timeout 0.0, expected"),
        (["--hosts", "a", "--resume-arg", "--resume x", *COMMAND],
         "--resume-arg without --max-restarts: it would never be used"),
        (["--hosts", "a", "--max-restarts", "1", "--resume-arg", "--resume 'x", *COMMAND],
         "--resume-arg \"--resume 'x\": No closing quotation"),
        (["--hosts", "a", "--launcher", "/bin/echo", *COMMAND],
         "/bin/echo: not the launcher of MPICH, Open MPI or Intel MPI"),
        (["--hosts", "a", "--launcher", LAUNCHER, "--remote-shell", "no-such-rsh", *COMMAND],
         "--remote-shell no-such-rsh: no such program"),
    ],
)  # fmt: skip
def test_bad_arguments_are_named(argv, message):
    with pytest.raises(InvalidArgumentError) as caught:
        parse(argv)
    assert message in str(caught.value)


def test_bad_arguments_end_the_wrapper_before_any_launch(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "collectives.run", *wrapper_argv(tmp_path, "--min-hosts", "4")],
        env={**os.environ, **write_script(tmp_path, ["exit 0"])}, cwd=REPO,
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    made = launches(tmp_path)
    assert done.returncode == 2
    assert "error: --min-hosts 4: more than the 3 hosts given" in done.stderr
    assert made == []


def test_hostfile_forms_and_errors(tmp_path):
    good = tmp_path / "good"
    good.write_text("# rack 1\na slots=2\n\nb:3  # the big one\nc\n")
    assert read_hostfile(good, ranks_per_host=2) == [Host("a", 2), Host("b", 3), Host("c", 2)]
    for text, message in [
        ("a\na:2\n", "line 2: host a is named twice"),
        ("a slots=2 extra\n", "line 1: 'a slots=2 extra', expected name, name:n or name slots"),
        ("a slots=x\n", "line 1: 'a:x', expected host:n with n >= 1 ranks"),
        ("# nothing\n", "names no host"),
    ]:
        bad = tmp_path / "bad"
        bad.write_text(text)
        with pytest.raises(InvalidArgumentError) as caught:
            read_hostfile(bad)
        assert str(caught.value).startswith(f"--hostfile {bad}") and message in str(caught.value)


def test_hosts_keep_their_order_and_counts():
    assert parse_hosts("n3:4,n1,n2:1", ranks_per_host=8) == [
        Host("n3", 4), Host("n1", 8), Host("n2", 1),
    ]  # fmt: skip


def test_a_launcher_that_exits_0_having_lost_a_host_failed():
    """Open MPI's exits 0 when it loses a host: the watch saw the host go, so it failed."""
    runs = iter([Ended(0, lost=("b",)), Ended(0)])
    outcome = supervise(
        [Host("a", 1), Host("b", 1)], lambda hosts, restart: next(runs), lambda hosts: [],
        max_restarts=0,
    )  # fmt: skip
    assert (outcome.returncode, outcome.stopped) == (1, "no restart left (--max-restarts 0)")
    assert outcome.attempts[0].gone == ["b"]
    assert summary(outcome).splitlines()[2:] == [
        "        0     0      0.0      2  b           a:1,b:1",
        "  (exit 0 with a host gone: the launcher lost a host and said 0, as Open MPI's does)",
    ]


def test_interrupted_stops_without_probing():
    probed = []
    outcome = supervise(
        [Host("a", 1)], lambda hosts, restart: Ended(130),
        lambda hosts: probed.append(hosts) or [], max_restarts=5, interrupted=lambda: True,
    )  # fmt: skip
    assert (outcome.stopped, outcome.returncode, probed) == ("interrupted", 130, [])


def test_summary_of_many_restarts_fits_one_screen():
    hosts = [Host(f"node{i:03d}", 8) for i in range(64)]
    attempts = [Attempt(r, hosts, Ended(1), seconds=1.0) for r in range(30)]
    text = summary(Outcome(attempts, "no restart left (--max-restarts 29)", 1), width=100)
    lines = text.splitlines()
    assert len(lines) == 2 + 3 + 1 + 8
    assert max(len(line) for line in lines) <= 100
    assert [line.split()[0] for line in lines[2:]] == [
        "0", "1", "2", "...", *[str(r) for r in range(22, 30)],
    ]  # fmt: skip
