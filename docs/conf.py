"""Sphinx configuration: MyST pages, an API reference from the docstrings, no network."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # the packages of this tree, not an installed copy

import collectives  # noqa: E402

project = "collectives"
author = "the collectives authors"
release = version = collectives.__version__

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Headings get anchors so that `page.md#section` links resolve, and a link to a page or an
# anchor that does not exist is a warning, so an error under -W: internal links are checked
# by the build itself, without reaching the network.
myst_heading_anchors = 4
myst_enable_extensions = ["colon_fence"]
nitpicky = False  # type names in signatures (numpy, cupy) are not documented here

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_mock_imports = ["cupy", "cupyx", "torch"]
napoleon_google_docstring = True
napoleon_numpy_docstring = False

html_theme = "alabaster"
html_static_path: list[str] = []
html_title = f"collectives {release}"
