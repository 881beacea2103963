"""Every module of the project, Python or C, stays small enough to read in one sitting: at
most 600 lines (split by concern past that, as ``_communicator.py`` into ``_args``,
``_lifecycle`` and the backends' own modules, or ``_callbooks.c`` into the types, one call and
the verbs' checks)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("collectives", "ddp", "pipeline")
MAX_LINES = 600


def test_every_module_is_at_most_600_lines():
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for package in PACKAGES
        for pattern in ("*.py", "*.c", "*.h")
        for path in sorted((ROOT / package).rglob(pattern))
    }
    assert len(sizes) > 50  # the packages were found
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
