"""Mistakes in the inventory's container entries, one line each naming the entry, read from the inventory
alone (and the node's GPU device nodes where they are known): an entry that is no mapping, a key that is
no setting (with the closest one), a value a setting does not take, a GPU listed twice or one the node
lacks, a vmid or hostname that another entry of the inventory also has.

The settings, what each one takes and the words for it are ct_table's rows. Controller only (the
inventory_check action, before any role runs).
"""

from __future__ import annotations

import difflib
from typing import Any

from ansible_collections.mlstack.pve.plugins.module_utils import ct_table, gpu_selection

FIX = "Fix the inventory entry."


def name(host: str, entry: Any, position: int) -> str:
    """How a line names an entry: by its vmid where it has one, else by its place in the node's list."""
    vmid = entry.get("vmid") if isinstance(entry, dict) else None
    return f"Container {vmid if vmid not in (None, '') else f'#{position + 1}'} on {host}"


def unknown_keys(who: str, entry: dict[str, Any]) -> list[str]:
    """A key that is no setting of an entry, with the closest setting (difflib) or, for a node's
    setting, where it goes."""
    out = []
    for key in entry:
        if str(key) in ct_table.ENTRY:
            continue
        node_row = next((s for s in ct_table.SETTINGS if s.key == str(key) and s.where == "node"), None)
        close = difflib.get_close_matches(str(key), list(ct_table.ENTRY), n=1, cutoff=0.6)
        if node_row:
            out.append(f"{who}: {key} is a node's setting, not a container's: set it on the node.")
        elif close:
            out.append(f"{who}: {key}: did you mean {close[0]}?")
        else:
            out.append(f"{who}: {key} is no container setting (they are: {', '.join(ct_table.ENTRY)}).")
    return out


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def values(who: str, entry: dict[str, Any]) -> list[str]:
    """What is wrong with the entry's values: one line for the settings' refusals (what each must be, and
    what was given), one for its `gpus` in gpu_selection's words."""
    bad = []
    for setting in ct_table.ENTRY.values():
        if setting.key == "gpus" or (setting.key not in entry and not setting.required):
            continue
        refused = setting.refusal(entry.get(setting.key))
        if refused:
            given = f" (not {_shown(entry[setting.key])})" if setting.key in entry else " (missing)"
            bad.append(refused + given)
    out = [f"{who}: expected {'; '.join(bad)}. {FIX}"] if bad else []
    try:
        gpu_selection.of_container(entry)
    except gpu_selection.SelectionError as e:
        out.append(f"{who}: {e}. {FIX}")
    return out


def _others(inventory: dict[str, Any]) -> list[tuple[str, int, dict[str, Any]]]:
    """Every entry of the inventory as (node, position, entry)."""
    return [
        (node, i, c)
        for node, entries in inventory.items()
        if isinstance(entries, list)
        for i, c in enumerate(entries)
        if isinstance(c, dict)
    ]


def overlaps(host: str, position: int, entry: dict[str, Any], inventory: dict[str, Any]) -> list[str]:
    """The entry's vmid or hostname where another entry of the inventory (any node) has it too."""
    out = []
    others = [(n, i, c) for n, i, c in _others(inventory) if (n, i) != (host, position)]
    vmid, hostname = entry.get("vmid"), entry.get("hostname")
    same_vmid = [
        f"{c.get('hostname', '?')} on {n}" for n, _, c in others if vmid and _same(c.get("vmid"), vmid)
    ]
    if same_vmid:
        out.append(
            f"Container {vmid} ({hostname}) on {host}: vmid {vmid} is also the vmid of"
            f" {', '.join(same_vmid)}. Each container needs its own vmid."
        )
    same_name = [name(n, c, i) for n, i, c in others if hostname and c.get("hostname") == hostname]
    if same_name:
        out.append(
            f"{name(host, entry, position)}: hostname {hostname} is also the hostname of"
            f" {', '.join(same_name)}. Each container needs its own hostname."
        )
    return out


def _same(a: Any, b: Any) -> bool:
    return str(a).strip() == str(b).strip()


def gpus_present(who: str, entry: dict[str, Any], gpu_nodes: list[str]) -> list[str]:
    """GPU indices of the entry that the node has no device node for."""
    try:
        gpu_selection.select_nodes(gpu_nodes, entry.get("gpus", gpu_selection.DEFAULT))
    except gpu_selection.SelectionError as e:
        return [f"{who}: {e}. Fix the inventory entry (or the node, where a GPU is missing from it)."]
    return []


def asks_indices(containers: Any) -> bool:
    """Whether an entry lists GPU indices (so the node's device nodes decide whether it can have them)."""
    return isinstance(containers, list) and any(
        isinstance(c, dict) and isinstance(c.get("gpus"), list) and c["gpus"] for c in containers
    )


def mistakes(
    host: str, containers: Any, inventory: dict[str, Any] | None = None, gpu_nodes: list[str] | None = None
) -> list[str]:
    """Every mistake of a node's entries, entry by entry. `inventory` ({node: entries}, every node) finds
    vmids and hostnames given twice; `gpu_nodes` (the node's device nodes, where read) GPUs it lacks."""
    if containers is None:  # `mlstack_containers:` left empty: a node without containers
        return []
    if not isinstance(containers, list):
        return [
            f"{host}: mlstack_containers must be a list of container entries (each with vmid, hostname, ...),"
            f" not {type(containers).__name__} {_shown(containers)}. Fix the inventory."
        ]
    inventory = inventory if inventory is not None else {host: containers}
    out: list[str] = []
    for position, entry in enumerate(containers):
        who = name(host, entry, position)
        if not isinstance(entry, dict):
            out.append(
                f"{who}: expected a mapping of settings (vmid: ..., hostname: ...), not {_shown(entry)}."
            )
            continue
        found = unknown_keys(who, entry) + values(who, entry) + overlaps(host, position, entry, inventory)
        if gpu_nodes is not None and ct_table.ENTRY["gpus"].valid(entry.get("gpus", gpu_selection.DEFAULT)):
            found += gpus_present(who, entry, gpu_nodes)
        out += found
    return out
