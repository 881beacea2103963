"""The Python pieces of ``.ci/gpu``: ``python .ci/gpu_tools.py COMMAND ARGS``.

versions [--rehearse]         the versions of everything a GPU run depends on, as JSON
nccl-probe BACKEND            init on BACKEND, one out-of-place all_reduce (an NCCL kernel),
                              checked, and NCCL's init/destroy timed (run under mpiexec)
gpt-losses A B LAUNCH...      examples/gpt_3d.py on backends A and B: the same float64 losses
gpt-meshes A B LAUNCH...      gpt-losses with --tp 2, --pp 2 and --dp 2 in turn
precision BACKEND PY LAUNCH   the mixed-precision SPMD modules, and a GPT checkpoint saved and
                              resumed on BACKEND: the losses of a run that never stopped
latency OUT LAUNCH...         a benchmark command run synchronous, then with --async: one JSON
collect WORK OUT              results.json from the versions, the steps and the benchmarks' JSON
check-outdir OUTDIR           what a lent GPU machine can send back: 8 files, 16 MiB each, ...

Every failure raises (a traceback) or exits non-zero with a line that says why.
"""

from __future__ import annotations

import glob
import json
import os
import platform
import re
import subprocess
import sys

#: what a lent GPU machine sends back from its output folder
MAX_FILES, MAX_FILE_BYTES, MAX_DEPTH = 8, 16 * 2**20, 2
NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def versions(rehearse: bool) -> dict:
    info: dict = {"python": sys.version.split()[0], "platform": platform.platform()}
    if not rehearse:
        import cupy
        from cupy.cuda import nccl, runtime

        props = runtime.getDeviceProperties(0)
        name = props["name"]
        info["gpu"] = name.decode() if isinstance(name, bytes) else str(name)
        info["gpus"] = runtime.getDeviceCount()
        info["gpu_memory_gib"] = round(props["totalGlobalMem"] / 2**30, 1)
        info["compute_capability"] = f"{props['major']}.{props['minor']}"
        v = runtime.driverGetVersion()
        info["cuda_driver_api"] = f"{v // 1000}.{v % 1000 // 10}"
        v = runtime.runtimeGetVersion()
        info["cuda_runtime"] = f"{v // 1000}.{v % 1000 // 10}"
        info["cupy"] = cupy.__version__
        info["nccl_available"] = bool(getattr(nccl, "available", True))
        try:
            v = nccl.get_version()
            info["nccl_version_code"] = v
            info["nccl"] = f"{v // 10000}.{v % 10000 // 100}.{v % 100}"
        except Exception as e:  # CuPy without a loadable libnccl has no get_version
            info["nccl"] = f"not loaded ({type(e).__name__}: {e})"
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libnccl" in line and "/" in line}
        info["libnccl"] = sorted(paths)
    import mpi4py
    from mpi4py import MPI

    info["mpi4py"] = mpi4py.__version__
    info["mpi_library"] = MPI.Get_library_version().replace("\0", "").strip().splitlines()[0]
    major, minor = MPI.Get_version()
    info["mpi_standard"] = f"{major}.{minor}"
    for module in ("numpy", "torch", "matplotlib", "pytest", "ml_dtypes"):
        try:
            info[module] = __import__(module).__version__
        except Exception as e:
            info[module] = f"not importable ({type(e).__name__})"
    return info


def nccl_probe(backend: str, times: int = 10) -> None:
    """One communicator on ``backend``, one out-of-place all_reduce (in place at one rank NCCL
    launches no kernel) checked on every rank; then ``init`` and ``close`` timed ``times``
    times, and NCCL's own communicator creation and destroy."""
    import statistics
    import time

    import collectives as col

    with col.init(backend=backend, timeout=120) as comm:
        xp = comm.xp
        x = xp.arange(1024, dtype=xp.float32) + comm.rank
        out = comm.all_reduce(x, out=xp.empty_like(x))
        want = comm.size * xp.arange(1024, dtype=xp.float32) + sum(range(comm.size))
        wrong = int((out != want).sum())
        print(f"rank {comm.rank} of {comm.size} on {comm.backend}: all_reduce, {wrong} wrong")
        if wrong:
            raise SystemExit(f"rank {comm.rank}: {wrong} of 1024 elements wrong")
    inits = []
    for _ in range(times):
        start = time.perf_counter()
        col.init(backend=backend, timeout=120).close()
        inits.append(time.perf_counter() - start)
    from mpi4py import MPI

    if MPI.COMM_WORLD.rank == 0:
        print(f"init + close on {backend}, {MPI.COMM_WORLD.size} rank(s), {times} times: "
              f"median {statistics.median(inits):.3f} s, {min(inits):.3f} to {max(inits):.3f} s")  # fmt: skip


def gpt_run(argv: list[str]) -> list[float]:
    """The losses ``examples/gpt_3d.py`` prints when run by ``argv`` (its output into the
    log: stderr, a traceback, straight; stdout read for the losses)."""
    print("$", " ".join(argv), flush=True)
    run = subprocess.run(argv, stdout=subprocess.PIPE, text=True)
    print(run.stdout, end="", flush=True)
    if run.returncode != 0:
        raise SystemExit(f"{' '.join(argv[-6:])} exited {run.returncode}")
    return [float(line.split()[3]) for line in run.stdout.splitlines() if line.startswith("step ")]


def gpt_losses(first: str, second: str, launch: list[str]) -> None:
    """The GPT example's float64 losses on two backends agree within 1e-9 relative (GPU
    reductions round in another order). ``launch``: the mpiexec command and the mesh flags,
    split at ``--``."""
    split = launch.index("--")
    mpiexec, mesh = launch[:split], launch[split + 1 :]

    def losses(backend: str) -> list[float]:
        return gpt_run([*mpiexec, sys.executable, "examples/gpt_3d.py", "--backend", backend,
                        "--steps", "3", *mesh])  # fmt: skip

    a, b = losses(first), losses(second)
    if not (len(a) == len(b) == 3):
        raise SystemExit(f"expected 3 losses from each run, got {a} and {b}")
    worst = max(abs(x - y) / abs(y) for x, y in zip(a, b))
    print(f"largest relative difference between {first} and {second}: {worst:.2e}")
    if worst > 1e-9:
        raise SystemExit(f"the losses differ by {worst:.2e} relative, more than 1e-9")


def gpt_meshes(first: str, second: str, launch: list[str]) -> None:
    """:func:`gpt_losses` on each 2-rank mesh: tensor, pipeline and data parallel."""
    for mesh in (["--tp", "2"], ["--pp", "2"], ["--dp", "2"]):
        gpt_losses(first, second, [*launch, "--", *mesh])


def precision(backend: str, python: str, launch: list[str]) -> None:
    """The mixed-precision SPMD modules on ``backend`` at the launch's ranks, then a GPT
    checkpoint: 2 steps saved, resumed to 4, against 4 steps that never stopped (float64,
    exact)."""
    import tempfile

    ranks = launch[launch.index("-n") + 1]
    env = {**os.environ, "COLLECTIVES_TEST_BACKEND": backend,
           "COLLECTIVES_TEST_WORLD_SIZES": ranks, "COLLECTIVES_TEST_SPMD_TIMEOUT": "90",
           "COLLECTIVES_TEST_SPMD_BATCH": "1"}  # fmt: skip
    select = "test_mixed_precision or test_gpt_3d_precision"
    run = subprocess.run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE",
                          "tests/test_spmd.py", "-k", select], env=env)  # fmt: skip
    if run.returncode not in (0, 5):
        raise SystemExit(f"the mixed-precision modules failed (exit {run.returncode})")

    def losses(*flags: str) -> list[float]:
        return gpt_run([*launch, python, "examples/gpt_3d.py", "--backend", backend, "--tp",
                        ranks, *flags])  # fmt: skip

    with tempfile.TemporaryDirectory() as folder:
        whole = losses("--steps", "4")
        losses("--steps", "2", "--save", folder, "--save-every", "2")
        resumed = losses("--steps", "4", "--resume", folder)
    if resumed != whole[2:]:
        raise SystemExit(
            f"resumed losses {resumed} are not those of the run that never stopped {whole[2:]}"
        )
    print(
        f"checkpoint on {backend}: resumed at step 2, the same losses as a run that never stopped"
    )


def latency(out: str, command: list[str]) -> None:
    """``command`` (a benchmark writing ``--json``) synchronous, then with ``--async``: both
    JSONs in ``out`` as {"sync": ..., "async": ...}."""
    results = {}
    for form, extra in (("sync", []), ("async", ["--async"])):
        path = f"{out}.{form}"
        argv = [*command, *extra, "--json", path]
        print("$", " ".join(argv), flush=True)
        if subprocess.run(argv).returncode != 0:
            raise SystemExit(f"the {form} run failed")
        results[form] = _load(path)
        os.remove(path)
    with open(out, "w") as f:
        json.dump(results, f, indent=1)


def _load(path: str) -> object:
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        return {"unreadable": f"{type(e).__name__}: {e}"}


def collect(work: str, out: str) -> None:
    """results.json: versions, every step so far, and each benchmark's JSON by name; written
    whole and renamed into place, so that a run cut short leaves a readable file."""
    steps = []
    with open(os.path.join(work, "steps.tsv")) as f:
        for line in f:
            name, status, seconds, budget, note = line.rstrip("\n").split("\t")
            steps.append({"step": name, "status": status, "seconds": int(seconds),
                          "budget_s": int(budget), "note": note})  # fmt: skip
    results = {"versions": _load(os.path.join(work, "versions.json")), "steps": steps}
    for path in sorted(glob.glob(os.path.join(work, "*.json"))):
        name = os.path.basename(path)[: -len(".json")]
        if name != "versions":
            results[name] = _load(path)
    with open(out + ".part", "w") as f:
        json.dump(results, f, indent=1)
    os.replace(out + ".part", out)


def outdir_problems(outdir: str) -> list[str]:
    """Why a lent GPU machine would not send ``outdir`` back whole (empty: it would)."""
    problems, files = [], []
    for root, dirs, names in os.walk(outdir):
        depth = os.path.relpath(root, outdir).count(os.sep) + (root != outdir)
        for name in dirs + names:
            if not NAME.match(name):
                problems.append(f"{os.path.join(root, name)}: a name of other than letters, "
                                "digits, '.', '_' and '-'")  # fmt: skip
        for name in names:
            path = os.path.join(root, name)
            files.append(path)
            if depth > MAX_DEPTH:
                problems.append(f"{path}: more than {MAX_DEPTH} folders below the output folder")
            if os.path.getsize(path) >= MAX_FILE_BYTES:
                problems.append(f"{path}: {os.path.getsize(path)} bytes, not under 16 MiB")
    if len(files) > MAX_FILES:
        problems.append(f"{len(files)} files, more than {MAX_FILES}: {sorted(files)}")
    return problems


def main(argv: list[str]) -> None:
    command, args = argv[0], argv[1:]
    if command == "versions":
        print(json.dumps(versions("--rehearse" in args), indent=1))
    elif command == "nccl-probe":
        nccl_probe(args[0])
    elif command == "gpt-losses":
        gpt_losses(args[0], args[1], args[2:])
    elif command == "gpt-meshes":
        gpt_meshes(args[0], args[1], args[2:])
    elif command == "precision":
        precision(args[0], args[1], args[2:])
    elif command == "latency":
        latency(args[0], args[1:])
    elif command == "collect":
        collect(args[0], args[1])
    elif command == "check-outdir":
        problems = outdir_problems(args[0])
        for line in problems:
            print(f"cannot come back: {line}")
        if problems:
            raise SystemExit(1)
        print(f"{args[0]}: every file can come back ({MAX_FILES} files at most, under 16 MiB each)")
    else:
        raise SystemExit(f"unknown command {command!r}\n{__doc__}")


if __name__ == "__main__":
    main(sys.argv[1:])
