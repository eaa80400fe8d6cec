"""The gpu_container preflight's readings of what a spec cannot express: whether a path lies within the
folders that may be bind-mounted, and which passed-through device nodes of existing containers the node
lacks. Standard library only."""

from __future__ import annotations

import posixpath
import re
from typing import Any

from ansible_collections.mlstack.pve.plugins.module_utils import gpu_selection

_DEV_KEY = re.compile(r"^dev\d+$")
# Nodes the pve_host role recreates itself (nvidia-modprobe -u) when the driver is loaded.
_RECREATED_BY_HOST = re.compile(r"^/dev/nvidia-uvm(-tools)?$")


def path_within(path: str, roots: list[str]) -> bool:
    """Whether absolute `path` is one of `roots` or lies below one (no `..` tricks: paths are normalised)."""
    if not path or not path.startswith("/"):
        return False
    norm = posixpath.normpath(path)
    for root in roots:
        root = posixpath.normpath(str(root))
        if root.startswith("/") and (norm == root or norm.startswith(root.rstrip("/") + "/")):
            return True
    return False


def _dev_path(value: str) -> str:
    head = str(value).split(",", 1)[0].strip()
    return head.split("=", 1)[1] if head.startswith("path=") else head


def missing_passthrough(
    guests: list[dict[str, Any]],
    containers: list[dict[str, Any]],
    host_nodes: list[str],
    driver_loaded: bool = False,
) -> list[dict[str, Any]]:
    """devN entries of existing inventory containers whose host node is missing, so PVE would refuse to
    start them ("Device /dev/x does not exist"). Entries this run drops anyway (a GPU no longer in the
    container's `gpus`) and uvm nodes the node role recreates (driver loaded) are not reported."""
    wanted = {int(c["vmid"]): c.get("gpus", gpu_selection.DEFAULT) for c in containers}
    present = set(host_nodes)
    out = []
    for guest in guests:
        vmid = int(guest.get("vmid", 0))
        if vmid not in wanted or guest.get("type", "lxc") != "lxc":
            continue
        for key, value in sorted((guest.get("config") or {}).items()):
            if not _DEV_KEY.match(key):
                continue
            path = _dev_path(value)
            if path in present or not path.startswith("/dev/nvidia"):
                continue
            if gpu_selection.dropped_gpu_node(path, wanted[vmid]):
                continue
            if driver_loaded and _RECREATED_BY_HOST.match(path):
                continue
            out.append({"vmid": vmid, "key": key, "path": path})
    return out
