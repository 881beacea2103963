"""The modules of ``collectives``, ``ddp`` and ``pipeline`` import each other without a cycle.

The graph is read from the source (every ``import`` that runs: at module level or inside a
function; those under ``if TYPE_CHECKING:`` never run and are left out), so a cycle hidden
by an import inside a function counts as one. A package's ``__init__`` is not an edge of
its submodules (Python runs it first, whoever imports them); an explicit import of the
package from inside it is. The compiled modules (``pyproject.toml``'s ext-modules) are
modules of the graph too, importing nothing of it, whether or not they are built.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.mpi_independent  # the source's import graph: no MPI

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("ddp", "pipeline")
#: every package of the project, for the cycle check
ALL_PACKAGES = ("collectives", *PACKAGES)


def module_name(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> list[tuple[ast.stmt, bool]]:
    """Every import statement that can run, with whether it is inside a function."""
    found: list[tuple[ast.stmt, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                for other in child.orelse:
                    visit(other, in_function)
                continue
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append((child, in_function))
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef))
            visit(child, inner)

    visit(tree, False)
    return found


def import_graph(
    root: Path, packages: tuple[str, ...], extensions: tuple[str, ...] = ()
) -> dict[str, dict[str, bool]]:
    """module -> {imported module of ``packages``: whether it is imported inside a function}.
    ``extensions``: compiled modules (no source here), which import nothing of ``packages``.

    Example: ``{"pkg.a": {"pkg.b": False, ...}, ...}``.
    """
    paths = {module_name(root, p): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    graph: dict[str, dict[str, bool]] = {name: {} for name in extensions}
    paths.update({name: root for name in extensions})
    for module, path in paths.items():
        if module in extensions:
            continue
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: dict[str, bool] = {}
        for node, in_function in _imports(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base] if base else anchor)
                # ``from pkg import name``: the submodule pkg.name where there is one
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base
                    for alias in node.names
                ]
            for target in targets:
                while target and target not in paths:  # import a.b.c: the module a.b.c
                    target = target.rpartition(".")[0]
                if target and target != module:
                    edges[target] = edges.get(target, False) or in_function
        graph[module] = edges
    return graph


def find_cycle(graph: dict[str, dict[str, bool]]) -> list[str] | None:
    """One import cycle (``[a, b, a]``), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph.get(module, {})):
            if state.get(target) == 1:
                return path[path.index(target) :] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        path.pop()
        state[module] = 2
        return None

    for module in sorted(graph):
        if module not in state and (cycle := visit(module)):
            return cycle
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, bool]]:
    return import_graph(ROOT, PACKAGES)


def _source_modules(packages: tuple[str, ...]) -> set[str]:
    return {module_name(ROOT, p) for pkg in packages for p in (ROOT / pkg).rglob("*.py")}


def _relative_importers(packages: tuple[str, ...]) -> set[str]:
    """The modules (not ``__init__``) with a module-level line ``from .x import ...`` or
    ``from . import x`` (read as text, apart from the graph's parser): each must have an edge
    in the graph."""
    return {
        module_name(ROOT, p)
        for pkg in packages
        for p in (ROOT / pkg).rglob("*.py")
        if p.name != "__init__.py"
        and any(line.startswith("from .") for line in p.read_text().splitlines())
    }


def test_the_graph_holds_every_module_and_its_imports(graph):
    assert set(graph) == _source_modules(PACKAGES)
    importers = _relative_importers(PACKAGES)
    assert len(importers) > 5  # ddp and pipeline are made of modules that import each other
    assert sorted(m for m in importers if not graph[m]) == []
    assert all(set(edges) <= set(graph) for edges in graph.values())


def test_ddp_and_pipeline_have_no_import_cycle(graph):
    assert find_cycle(graph) is None


def test_no_module_of_the_project_is_in_an_import_cycle_even_through_a_function():
    everything = import_graph(ROOT, ALL_PACKAGES)
    assert set(everything) == _source_modules(ALL_PACKAGES)
    # imports inside functions count: the project has some (the NCCL backend is imported
    # only when init() chooses it), and they are edges of the graph searched
    assert any(inside for edges in everything.values() for inside in edges.values())
    assert find_cycle(everything) is None


def test_the_project_is_pure_python():
    # no C extension to build: an install needs no compiler (a py3-none-any wheel)
    assert "ext-modules" not in (ROOT / "pyproject.toml").read_text()
    for package in ALL_PACKAGES:
        assert not [p for p in (ROOT / package).rglob("*") if p.suffix in (".c", ".h", ".so")]


def test_no_module_imports_its_own_packages_inside_a_function(graph):
    hidden = sorted(
        f"{module} -> {target}"
        for module, edges in graph.items()
        for target, in_function in edges.items()
        if in_function
    )
    assert hidden == []


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from .a import f\n")
    (pkg / "a.py").write_text("from .b import g\n\ndef f():\n    return g()\n")
    (pkg / "b.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .c import C\n\n"
        "def g():\n    from . import a\n\n    return a\n"
    )
    (pkg / "c.py").write_text("from .b import g\n")
    found = import_graph(tmp_path, ("pkg",))
    assert found["pkg.a"] == {"pkg.b": False}
    assert found["pkg.b"] == {"pkg.a": True}  # the type-only import of c never runs
    assert find_cycle(found) == ["pkg.a", "pkg.b", "pkg.a"]
    (pkg / "b.py").write_text("def g():\n    return 1\n")
    assert find_cycle(import_graph(tmp_path, ("pkg",))) is None
