"""Every docstring example of collectives, ddp and pipeline runs, as a doctest (in-process).

One test per module, so a failure names the module; it also checks that doctest finds every
``>>>`` line of the module (none sits where no docstring is collected). Each docstring runs
in its module's globals plus this shared namespace (the communicator is made once, the
arrays afresh for every docstring):

- ``np``: numpy; ``col``: collectives;
- ``comm``: a real communicator, ``col.init("mpi", timeout=60)``: a world of one rank (no
  launcher: no mpiexec), closed at the end; no example may close it (checked per module);
- ``x``: ``np.arange(4, dtype=np.float32)``; ``grad``: ``np.ones(4, np.float32)``;
- ``params``: ``{"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}``, the
  parameters of the ``ddp`` examples.

While they run, ``COLLECTIVES_BACKEND=mpi`` (an example's own ``col.init()`` is on the MPI
backend, GPU or not) and ``COLLECTIVES_MPI_BLOCKING=0`` (the same output under every MPI).
Options: ``ELLIPSIS | NORMALIZE_WHITESPACE``.

An example runs at one rank on NumPy, written so (``comm.size``, ``comm.rank``) where the
API is about several ranks; an example that makes a communicator closes it. Those that
cannot run here are marked ``# doctest: +SKIP`` and kept correct: 6 examples
(``test_skipped_examples`` counts them), for three reasons:

- a GPU (CuPy, NCCL): ``make_nccl_backend`` (``collectives/_nccl/backend.py``) and
  ``nan_flags`` on a CuPy array (``collectives/_nccl/nan.py``);
- hooks that stay for the rest of the test process: ``col.abort_on_exception()``
  (``collectives/_safety/abort.py``) and ``install()`` (``collectives/_safety/exit.py``)
  replace ``sys.excepthook`` and ``sys.exit`` and register an exit handler;
- files written to the working directory: ``plot.schedule`` and ``plot.timelines``
  (``pipeline/plot.py``).
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import pkgutil

import numpy as np
import pytest

import collectives as col

PACKAGES = ("collectives", "ddp", "pipeline")
OPTIONS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
#: the examples marked ``# doctest: +SKIP``, listed with their reasons in the docstring above
SKIPPED = 6


def _modules() -> list[str]:
    names = []
    for package in PACKAGES:
        names.append(package)
        path = importlib.import_module(package).__path__
        names += [m.name for m in pkgutil.walk_packages(path, package + ".")]
    return sorted(names)


MODULES = _modules()


@pytest.fixture(scope="module")
def comm():
    with pytest.MonkeyPatch.context() as env:
        env.setenv("COLLECTIVES_BACKEND", "mpi")
        env.setenv("COLLECTIVES_MPI_BLOCKING", "0")
        c = col.init("mpi", timeout=60)
        yield c
        c.close()


def _fixtures(comm) -> dict:
    return {
        "np": np,
        "col": col,
        "comm": comm,
        "x": np.arange(4, dtype=np.float32),
        "grad": np.ones(4, np.float32),
        "params": {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)},
    }


def _tests(name: str) -> list[doctest.DocTest]:
    finder = doctest.DocTestFinder(exclude_empty=True)
    return [t for t in finder.find(importlib.import_module(name), name) if t.examples]


def _prompts(name: str) -> int:
    """The ``>>>`` lines of a module's source, each of which starts an example (but those
    holding only a comment)."""
    source = inspect.getsource(importlib.import_module(name))
    lines = (line.strip() for line in source.splitlines())
    return sum(s.startswith(">>>") and not s[3:].lstrip().startswith("#") for s in lines)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name, comm):
    tests = _tests(name)
    found = sum(len(t.examples) for t in tests)
    assert found == _prompts(name), f"{name}: some examples are in no docstring doctest finds"
    runner = doctest.DocTestRunner(optionflags=OPTIONS)
    for test in tests:
        test.globs.update(_fixtures(comm))
        runner.run(test)
    failed, _ = runner.summarize(verbose=False)
    assert not failed, f"{failed} example(s) of {name} failed (doctest's report above)"
    assert not comm.closed, f"an example of {name} closed the shared communicator"


def test_skipped_examples():
    """The count of skipped examples stays the one the module docstring explains."""
    skipped = [
        f"{test.name} (line {test.lineno + example.lineno + 1})"
        for name in MODULES
        for test in _tests(name)
        for example in test.examples
        if example.options.get(doctest.SKIP)
    ]
    assert len(skipped) == SKIPPED, skipped
