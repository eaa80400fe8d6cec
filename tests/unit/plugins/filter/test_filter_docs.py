"""The collection's filters are the Jinja face of what the roles' YAML uses: each one a play calls, each
one documented for ansible-doc (plugins/filter/<name>.yml), and no documentation left for a filter that
is gone. Logic that only Python uses lives in module_utils."""

from __future__ import annotations

import importlib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[4]
FILTERS = ROOT / "plugins" / "filter"
# Where YAML and templates use filters: the roles, the playbooks, the molecule scenarios.
USERS = [ROOT / "roles", ROOT / "playbooks", ROOT / "molecule"]


def exported() -> dict[str, str]:
    """Every filter name the collection's FilterModules export, with the file that exports it."""
    names = {}
    for path in sorted(FILTERS.glob("*.py")):
        module = importlib.import_module(f"ansible_collections.mlstack.pve.plugins.filter.{path.stem}")
        names |= {name: path.name for name in module.FilterModule().filters()}
    return names


def yaml_text() -> str:
    return "\n".join(
        p.read_text() for folder in USERS for p in sorted(folder.rglob("*")) if p.suffix in (".yml", ".j2")
    )


def test_every_filter_is_documented_and_every_doc_is_a_filter() -> None:
    docs = {p.stem: yaml.safe_load(p.read_text())["DOCUMENTATION"]["name"] for p in FILTERS.glob("*.yml")}
    assert all(stem == name for stem, name in docs.items()), docs
    assert set(docs) == set(exported())


def test_every_filter_is_used_by_a_play() -> None:
    text = yaml_text()
    unused = sorted(name for name in exported() if f"mlstack.pve.{name}" not in text)
    assert unused == [], f"filters no play uses (Python imports module_utils instead): {unused}"
