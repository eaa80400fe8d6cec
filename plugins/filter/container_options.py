"""Filters that turn an inventory container entry into PVE container options."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.mlstack.pve.plugins.module_utils.gpu_selection import SelectionError, select_nodes


def selected_gpu_nodes(nodes: list[str], gpus: Any) -> list[str]:
    """Device nodes for `gpus` ('all', 'none' or a list of indices): the chosen GPUs plus the shared nodes
    (module_utils/gpu_selection.py)."""
    try:
        return select_nodes(nodes, gpus)
    except SelectionError as e:
        raise AnsibleFilterError(str(e)) from e


def device_options(nodes: list[str], gpus: Any, gid: int = 44, mode: str = "0666") -> dict[str, str]:
    """devN options for PVE: `dev0: /dev/nvidia0,gid=44,mode=0666`, one per selected node."""
    return {
        f"dev{i}": f"{path},gid={gid},mode={mode}" for i, path in enumerate(selected_gpu_nodes(nodes, gpus))
    }


def mount_options(mounts: list[dict[str, Any]]) -> dict[str, str]:
    """mpN options for PVE bind mounts from [{host, ct, ro}], skipping entries with an empty host path."""
    out: dict[str, str] = {}
    for m in (m for m in mounts if m.get("host")):
        value = f"{m['host']},mp={m['ct']}"
        if m.get("ro"):
            value += ",ro=1"
        out[f"mp{len(out)}"] = value
    return out


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "selected_gpu_nodes": selected_gpu_nodes,
            "device_options": device_options,
            "mount_options": mount_options,
        }
