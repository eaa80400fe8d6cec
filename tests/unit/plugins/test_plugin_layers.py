"""The collection's plugins import one way: filters (the Jinja face), action plugins and modules stand
on module_utils, where the logic lives; nothing under module_utils, action or modules imports a filter.
Imports are read from the source (ast), those inside functions included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PLUGINS = Path(__file__).resolve().parents[3] / "plugins"
PREFIX = "ansible_collections.mlstack.pve.plugins."


def plugin_imports(path: Path) -> set[str]:
    """The collection's plugin modules `path` imports, as folder/name (module_utils/fleet)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(PREFIX):
            target = node.module.removeprefix(PREFIX).replace(".", "/")
            if "/" in target:
                found.add(target)
            else:  # from ...plugins.module_utils import fleet
                found |= {f"{target}/{a.name}" for a in node.names}
        elif isinstance(node, ast.Import):
            found |= {
                a.name.removeprefix(PREFIX).replace(".", "/") for a in node.names if a.name.startswith(PREFIX)
            }
    return found


def test_the_imports_are_read() -> None:
    """The rule below has something to check: the action plugins' and filters' imports are seen."""
    assert "module_utils/fleet" in plugin_imports(PLUGINS / "action" / "fleet_report.py")
    assert "module_utils/gpu_selection" in plugin_imports(PLUGINS / "filter" / "node_gpus.py")


@pytest.mark.parametrize("folder", ["module_utils", "action", "modules"])
def test_no_logic_layer_imports_a_filter(folder: str) -> None:
    wrong = sorted(
        f"{path.relative_to(PLUGINS)} imports {dep}"
        for path in sorted((PLUGINS / folder).glob("*.py"))
        for dep in plugin_imports(path)
        if not dep.startswith("module_utils/")
    )
    assert wrong == [], (
        "; ".join(wrong) + " (move the logic to plugins/module_utils and import it from there)"
    )
