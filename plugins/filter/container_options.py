"""Filters that turn an inventory container entry into PVE container options."""

from __future__ import annotations

import re
from typing import Any

from ansible.errors import AnsibleFilterError

_GPU_NODE = re.compile(r"^/dev/nvidia(\d+)$")
# Only NVIDIA nodes are ever passed through.
_NVIDIA_NODE = re.compile(r"^/dev/nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset|-caps/nvidia-cap\d+)$")


def selected_gpu_nodes(nodes: list[str], gpus: Any) -> list[str]:
    """Device nodes for `gpus` ('all', 'none' or a list of indices): the chosen GPUs plus the shared nodes."""
    nodes = sorted({n for n in nodes if _NVIDIA_NODE.match(n)}, key=_node_order)
    if gpus in (None, "none", []) or gpus is False:
        return []
    if gpus == "all":
        return nodes
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        # `gpus: 0` reads as "GPU 0" to one person and "no GPUs" to another: neither is guessed.
        raise AnsibleFilterError(
            f"gpus: {gpus} is not a list: write [{gpus}] for GPU {gpus}, or none for no GPU"
        )
    if not isinstance(gpus, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in gpus):
        raise AnsibleFilterError(f"gpus must be 'all', 'none' or a list of GPU indices, not {gpus!r}")
    present = {int(m.group(1)) for n in nodes if (m := _GPU_NODE.match(n))}
    missing = sorted(set(gpus) - present)
    if missing:
        raise AnsibleFilterError(f"GPU index(es) {missing} not present on the node (has {sorted(present)})")
    return [n for n in nodes if not (m := _GPU_NODE.match(n)) or int(m.group(1)) in gpus]


def _node_order(path: str) -> tuple[int, int, str]:
    m = _GPU_NODE.match(path)
    return (0, int(m.group(1)), path) if m else (1, 0, path)


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
