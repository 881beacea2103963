"""The version of the project's three packages, in one place: setuptools reads it for the
distribution (``pyproject.toml``, ``[tool.setuptools.dynamic]``), and ``collectives``, ``ddp``
and ``pipeline`` export it as ``__version__``."""

__version__ = "0.1.0"
