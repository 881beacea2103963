"""Jobs across emulated nodes (tests/nodes.py), launched by each MPI's own multi-host
launcher: local ranks, ``hierarchical``, check mode, the timeout naming the missing rank on
every node, a node killed, a link cut, an uncaught exception on another node, and the GPT
example saved across nodes and resumed.

Each test makes its nodes (a tenth of a second) and runs the cheapest job that shows the
behaviour, with short timeouts; the suite's own MPI (the ``mpiexec`` beside this Python)
launches them, so each MPI family's run of the suite covers its own launcher."""

from __future__ import annotations

import re
import sys
import time
from pathlib import Path

import pytest

from tests.nodes import Nodes, skip_unless_available

pytestmark = pytest.mark.usefixtures("nodes_available")


@pytest.fixture(scope="module")
def nodes_available():
    skip_unless_available()


def _script(nodes: Nodes, text: str, name: str = "job.py") -> list[str]:
    """``python script SHARED`` for a job: the script written where every node sees it,
    given that folder (``sys.argv[1]``) for what it writes."""
    path = nodes.shared / name
    path.write_text(text)
    return [sys.executable, str(path), str(nodes.shared)]


def _wait_for(paths: list[Path], limit: float) -> list[Path]:
    """The paths still missing after waiting at most ``limit`` seconds for them."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline and not all(p.exists() for p in paths):
        time.sleep(0.05)
    return [p for p in paths if not p.exists()]


# ---------------------------------------------------------------- a timeout names the missing

# Rank `missing` never reaches collective #2; rank `first` times out first (1.5 s), the
# others later (8 s) unless told. Every rank but the missing one writes its error to a file.
MISSING = """
import sys, time, numpy as np, collectives as col
from mpi4py import MPI
rank = MPI.COMM_WORLD.Get_rank()
comm = col.init(backend="mpi", timeout=1.5 if rank == {first} else 8.0, mpi_blocking=False)
comm.all_reduce(np.ones(2))
if rank == {missing}:
    time.sleep(60)
try:
    comm.all_reduce(np.ones(2))
except col.CollectiveTimeoutError as e:
    open(f"{{sys.argv[1]}}/error{{rank}}.txt", "w").write(str(e))
time.sleep(60)
"""


@pytest.mark.parametrize(
    "ranks,missing,first",
    [([2, 2], 3, 0), ([2, 2], 3, 2), ([2, 1, 2], 2, 4)],
    ids=["2x2-first-on-the-other-node", "2x2-first-beside-the-missing", "2+1+2-alone"],
)
def test_every_rank_s_timeout_names_the_rank_that_never_arrived(ranks, missing, first):
    with Nodes(len(ranks)) as nodes:
        argv = _script(nodes, MISSING.format(first=first, missing=missing))
        job = nodes.launch(argv, ranks)
        others = [r for r in range(sum(ranks)) if r != missing]
        files = [nodes.shared / f"error{r}.txt" for r in others]
        late = _wait_for(files, 30)
        job.kill()
        output = job.communicate()[0]
        assert not late, f"no error from {late}:\n{output}"
        named = re.compile(
            rf"have not reached collective #2: rank {missing} \((at collective #1|on no board)"
        )
        for rank, path in zip(others, files):
            error = path.read_text()
            assert named.search(error), f"rank {rank}'s error: {error}"
