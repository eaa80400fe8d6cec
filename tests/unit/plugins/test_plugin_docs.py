"""Every module's and plugin's documentation is what ansible-doc can show: DOCUMENTATION, RETURN and
EXAMPLES parse as YAML, and every description is text (a line like `- A: b` in a description list is a
mapping to YAML, which ansible-doc then refuses to render)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[3]
PLUGINS = sorted(
    p
    for kind in ("modules", "action", "connection", "callback")
    for p in (REPO / "plugins" / kind).glob("*.py")
    if p.name != "__init__.py"
)
BLOCKS = ("DOCUMENTATION", "RETURN", "EXAMPLES")


def doc_blocks(path: Path) -> dict[str, str]:
    blocks: dict[str, str] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            if node.targets[0].id in BLOCKS and isinstance(node.value, ast.Constant):
                blocks[node.targets[0].id] = node.value.value
    return blocks


def descriptions(tree: Any, where: str = "") -> list[tuple[str, Any]]:
    found: list[tuple[str, Any]] = []
    if isinstance(tree, dict):
        for key, value in tree.items():
            if key in ("description", "short_description"):
                found.append((f"{where}.{key}", value))
            found += descriptions(value, f"{where}.{key}")
    elif isinstance(tree, list):
        for i, value in enumerate(tree):
            found += descriptions(value, f"{where}[{i}]")
    return found


@pytest.mark.parametrize("path", PLUGINS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_docs_parse_and_describe_in_text(path: Path) -> None:
    blocks = doc_blocks(path)
    if path.parent.name == "modules":
        assert {"DOCUMENTATION", "RETURN", "EXAMPLES"} <= set(blocks), f"{path.name} lacks a doc block"
    for name, text in blocks.items():
        tree = yaml.safe_load(text)
        if name == "EXAMPLES":
            continue
        for where, value in descriptions(tree, name):
            items = value if isinstance(value, list) else [value]
            bad = [item for item in items if not isinstance(item, str)]
            assert not bad, f"{path.name} {where}: not text (a ': ' inside a line?): {bad}"
