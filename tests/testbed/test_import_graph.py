"""The testbed package's modules import one another one way only (no import cycle, counting imports
inside functions): each part can be read, and loaded, without the ones that use it."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "testbed" / "mlstack_testbed"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The package modules `path` imports, relative imports resolved."""
    here = module_name(path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(here[: len(here) - node.level + 1]) if node.level else ""
            target = ".".join(p for p in (base, node.module or "") if p)
            found.add(target)
            found |= {f"{target}.{a.name}" for a in node.names}
    return {m for m in found if m in modules} - {module_name(path)}


def test_no_import_cycles() -> None:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {name: imports_of(path, set(files)) for name, path in files.items()}
    # A package's __init__ re-exporting its own modules is not a cycle of the code.
    graph = {n: {m for m in deps if not n.startswith(m + ".")} for n, deps in graph.items()}
    cycles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        if node in trail:
            cycles.append([*trail[trail.index(node) :], node])
            return
        for dep in sorted(graph[node]):
            visit(dep, [*trail, node])

    for start in sorted(graph):
        visit(start, [])
    assert cycles == [], " ; ".join(" -> ".join(c) for c in cycles[:5])
