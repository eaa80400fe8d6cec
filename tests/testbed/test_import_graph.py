"""The testbed package's modules import one another one way only (no import cycle, counting imports
inside functions): each part can be read, and loaded, without the ones that use it. And its parts are
layers: the shared modules under lxc (the LXC translation), lxc under node (the stand-in PVE node) and
gpucheck (the passthrough proof), which never import each other; the CLI and the controller on top."""

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


# Each part, and the parts its modules may import (its own included). node and gpucheck both stand on lxc
# and never on each other: gpucheck drives node's pct as a command (`python -m mlstack_testbed.node.pct`),
# through its command line as a user does. Nothing imports the controller but the CLI, nor the CLI.
MAY_IMPORT = {
    "shared": {"shared"},
    "lxc": {"shared", "lxc"},
    "node": {"shared", "lxc", "node"},
    "gpucheck": {"shared", "lxc", "gpucheck"},
    "controller": {"shared", "lxc", "node", "controller"},
    "cli": {"shared", "lxc", "node", "controller", "cli"},
}
SUBPACKAGES = {"lxc", "node", "gpucheck"}
# The modules at the package's top: a new one must be placed here, in a part, before this test passes.
TOP_LEVEL = {
    "mlstack_testbed": "shared",
    "mlstack_testbed.paths": "shared",
    "mlstack_testbed.proc": "shared",
    "mlstack_testbed.client": "shared",
    "mlstack_testbed.controller": "controller",
    "mlstack_testbed.__main__": "cli",
}


# Within a part, modules that stand apart from the rest of it (the parts, or the modules, they may import).
# The node's access control is PVE's (users, tokens, roles, ACL, permission checks) and knows nothing of
# containers: it and its /access endpoints import only shared modules and each other, and the API backend
# uses them, never the other way.
MODULE_MAY_IMPORT = {
    "mlstack_testbed.node.access": {"shared"},
    "mlstack_testbed.node.access_api": {"shared", "mlstack_testbed.node.access"},
}


def part_of(module: str) -> str | None:
    """The layer a module belongs to; None for a top-level module not placed in TOP_LEVEL."""
    parts = module.split(".")
    if len(parts) > 1 and parts[1] in SUBPACKAGES:
        return parts[1]
    return TOP_LEVEL.get(module)


def package_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    return {name: imports_of(path, set(files)) for name, path in files.items()}


def test_every_module_has_a_layer() -> None:
    graph = package_graph()
    unplaced = sorted(m for m in graph if part_of(m) is None)
    assert unplaced == [], f"top-level modules with no layer (add them to TOP_LEVEL): {unplaced}"
    # The layout itself: each subpackage is there, so the rule below cannot hold by having nothing to check.
    assert {part_of(m) for m in graph} >= SUBPACKAGES | {"shared", "controller", "cli"}


def test_layers_import_downward_only() -> None:
    wrong = sorted(
        f"{module} ({part_of(module)}) imports {dep} ({part_of(dep)})"
        for module, deps in package_graph().items()
        for dep in deps
        if part_of(dep) not in MAY_IMPORT[part_of(module) or "shared"]
    )
    assert wrong == [], "; ".join(wrong)


def test_modules_that_stand_apart_import_only_their_parts() -> None:
    graph = package_graph()
    assert set(MODULE_MAY_IMPORT) <= set(graph), sorted(set(MODULE_MAY_IMPORT) - set(graph))
    wrong = sorted(
        f"{module} imports {dep} ({part_of(dep)})"
        for module, parts in MODULE_MAY_IMPORT.items()
        for dep in graph[module]
        if part_of(dep) not in parts and dep not in parts
    )
    assert wrong == [], "; ".join(wrong)
    # The rule holds something: the backend stands on the access control.
    assert "mlstack_testbed.node.access_api" in graph["mlstack_testbed.node.backend"]
    assert "mlstack_testbed.node.access" in graph["mlstack_testbed.node.access_api"]
