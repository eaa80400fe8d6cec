"""The node's GPUs a container's `gpus` selects, and whether any container asks for one: faces of
module_utils/gpu_selection.py, the one reading of `gpus`."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.mlstack.pve.plugins.module_utils import gpu_selection


def gpus_of(gpus: list[dict[str, Any]], selection: Any) -> list[dict[str, Any]]:
    """The GPUs a container gets from its `gpus` (all, none, or a list of indices)."""
    try:
        return gpu_selection.select_gpus(list(gpus or []), selection)
    except gpu_selection.SelectionError as e:
        raise AnsibleFilterError(str(e)) from e


def gpus_requested(containers: list[dict[str, Any]]) -> bool:
    """Whether any inventory container asks for a GPU (its `gpus` is not none)."""
    try:
        return gpu_selection.requested(list(containers or []))
    except gpu_selection.SelectionError as e:
        raise AnsibleFilterError(str(e)) from e


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"gpus_of": gpus_of, "gpus_requested": gpus_requested}
