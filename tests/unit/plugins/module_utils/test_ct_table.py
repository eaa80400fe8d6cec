"""The container settings' table is the one list of them: gpu_container's argument spec, docs/inventory.md's
table, the day-two reconciliation and the playbooks' defaults say what its rows say."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.mlstack.pve.plugins.module_utils import ct_settings, ct_table
from ansible_collections.mlstack.pve.plugins.module_utils.pve_errors import ROLE_PRIVILEGES

ROOT = Path(__file__).resolve().parents[4]
SPEC = ROOT / "roles/gpu_container/meta/argument_specs.yml"
DOC = ROOT / "docs/inventory.md"
BEGIN = "<!-- the rows of plugins/module_utils/ct_table.py (checked by test_ct_table.py) -->"
END = "<!-- end of container settings -->"


def spec_entry_options() -> dict[str, Any]:
    spec = yaml.safe_load(SPEC.read_text())["argument_specs"]
    return spec["main"]["options"]["gpu_container_list"]["options"]


def test_the_spec_lists_exactly_the_entry_settings() -> None:
    assert list(spec_entry_options()) == list(ct_table.ENTRY)


@pytest.mark.parametrize("setting", list(ct_table.ENTRY.values()), ids=list(ct_table.ENTRY))
def test_the_spec_says_what_the_row_says(setting: ct_table.Setting) -> None:
    option = spec_entry_options()[setting.key]
    assert option["type"] == setting.type
    assert option.get("elements") == setting.elements
    assert option.get("choices", []) == list(setting.choices)
    assert option.get("required", False) is setting.required
    if setting.default is None or setting.new_only:
        # A new container's default is named in words: an existing container keeps its own value.
        assert "default" not in option
    else:
        assert option["default"] == setting.default


def _default(setting: ct_table.Setting) -> str:
    value = setting.default
    if value is None:
        return "required" if setting.required else ""
    if isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, list):
        text = "[" + ", ".join(value) + "]"
    else:
        text = str(value) if value != "" else '""'
    return f"`{text}`" + (" (new containers)" if setting.new_only else "")


def doc_table() -> str:
    """docs/inventory.md's table, as the rows make it."""
    lines = [
        "| key | PVE's key | default | a value must be | on a running container | privilege | meaning |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in ct_table.SETTINGS:
        key = f"`{s.key}`" + (" (the node's)" if s.where == "node" else "")
        pve = f"`{s.pve}`" if s.pve else "none (inside the container)"
        privilege = s.privilege or "root in the container (`pct exec`)"
        lines.append(
            f"| {key} | {pve} | {_default(s)} | {s.expect} | {s.applies} | {privilege} | {s.meaning} |"
        )
    return "\n".join(lines)


def test_the_docs_table_is_the_table() -> None:
    text = DOC.read_text()
    assert BEGIN in text and END in text, f"docs/inventory.md lacks the markers {BEGIN!r} ... {END!r}"
    shown = text.split(BEGIN, 1)[1].split(END, 1)[0].strip()
    assert shown == doc_table(), "docs/inventory.md's settings table should read:\n" + doc_table()


@pytest.mark.parametrize(
    "setting",
    [s for s in ct_table.SETTINGS if s.applies in (ct_table.LIVE, ct_table.RESTART)],
    ids=lambda s: s.key,
)
def test_when_a_change_applies_is_what_the_reconciliation_does(setting: ct_table.Setting) -> None:
    """A changed value on a running container (devN/mpN: one it had already)."""
    key = setting.pve.replace("N", "0")
    assert ct_settings.applies(key, True, {key: "before"}) == setting.applies


@pytest.mark.parametrize("setting", list(ct_table.SETTINGS), ids=lambda s: s.key)
def test_each_privilege_is_one_the_docs_grant_or_root(setting: ct_table.Setting) -> None:
    named = set(re.findall(r"\b(?:VM|Datastore|SDN|Sys)\.[A-Za-z.]+[A-Za-z]", setting.privilege))
    assert named <= set(ROLE_PRIVILEGES), named - set(ROLE_PRIVILEGES)
    assert named or setting.privilege in ("", ct_table.ROOT) or "root@pam" in setting.privilege


def test_the_playbooks_defaults_are_the_tables() -> None:
    """group_vars/all.yml reads an entry's settings with `mlstack_container.<key> | default(...)`: the
    defaults there are the rows' (where a row has one: the stack policy fills in profile and extras)."""
    text = (ROOT / "playbooks/group_vars/all.yml").read_text()
    found = dict(re.findall(r"mlstack_container\.(\w+) \| default\(([^()]*)\)", text))
    assert found, "group_vars/all.yml reads no entry setting with a default"
    for key, said in found.items():
        assert key in ct_table.ENTRY, key
        if ct_table.ENTRY[key].default is not None:
            assert yaml.safe_load(said) == ct_table.ENTRY[key].default, key


@pytest.mark.parametrize(
    ("key", "value", "ok"),
    [
        ("cores", 4, True),
        ("cores", "4", True),
        ("cores", "four", False),
        ("cores", True, False),
        ("swap_mb", 0, True),
        ("vmid", 99, False),
        ("seq_len", [1024, 2048], True),
        ("seq_len", [], False),
        ("mlstack_monitor", "yes", True),
        ("mlstack_monitor", "maybe", False),
        ("onboot", "yes", False),
        ("gpus", [0, 0], False),
        ("profile", "", True),
        ("extras", "fla", False),
    ],
)
def test_what_a_setting_takes(key: str, value: Any, ok: bool) -> None:
    assert ct_table.ENTRY[key].valid(value) is ok


def day_two_rows() -> dict[str, str]:
    """docs/day-two.md's table of changes to an existing container: each key it names -> its "on a running
    container" words."""
    text = (ROOT / "docs/day-two.md").read_text()
    table = text.split("| entry key (or node variable) | on a running container | how |", 1)[1].split("\n\n")[
        0
    ]
    rows = [line.split("|")[1:3] for line in table.splitlines() if line.startswith("| `")]
    return {key: when.strip() for names, when in rows for key in re.findall(r"`([a-z_0-9]+)`", names)}


@pytest.mark.parametrize(
    "setting",
    [s for s in ct_table.SETTINGS if s.applies in (ct_table.LIVE, ct_table.RESTART)],
    ids=lambda s: s.key,
)
def test_day_two_says_when_each_setting_applies(setting: ct_table.Setting) -> None:
    """Every setting a day-two run changes is in docs/day-two.md's table, saying when it takes effect as the
    row does (live, or at the next start)."""
    said = day_two_rows().get(setting.key)
    assert said is not None, f"docs/day-two.md's table does not name {setting.key}"
    first = said.split(";")[0]
    assert "live" in first if setting.applies == ct_table.LIVE else "next start" in first, said


def test_real_cluster_grants_each_setting_the_privilege_of_its_row() -> None:
    """docs/real-cluster.md's row of VM.Config.* privileges, each with the PVE keys it is needed for (in
    order, `;` between privileges): the rows with those PVE keys name the same privilege."""
    text = (ROOT / "docs/real-cluster.md").read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `VM.Config.CPU`"))
    privileges, _, keys = (cell.strip() for cell in row.strip("|").split("|"))
    names = [p if p.startswith("VM.") else "VM.Config" + p for p in re.findall(r"`([A-Za-z.]+)`", privileges)]
    groups = [re.findall(r"`([a-z0-9]+)`", group) for group in keys.split(";")]
    assert len(names) == len(groups) > 1
    for privilege, pve_keys in zip(names, groups, strict=True):
        for key in pve_keys:
            assert privilege in ct_table.BY_PVE[key].privilege, (key, privilege)
