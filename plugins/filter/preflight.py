"""Filter for the preflight: the passed-through device nodes of existing containers that the node lacks
(module_utils/preflight.py)."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.mlstack.pve.plugins.module_utils import preflight
from ansible_collections.mlstack.pve.plugins.module_utils.gpu_selection import SelectionError


def missing_passthrough(
    guests: list[dict[str, Any]],
    containers: list[dict[str, Any]],
    host_nodes: list[str],
    driver_loaded: bool = False,
) -> list[dict[str, Any]]:
    """See module_utils/preflight.missing_passthrough; a refused `gpus` is an AnsibleFilterError."""
    try:
        return preflight.missing_passthrough(guests, containers, host_nodes, driver_loaded)
    except SelectionError as e:
        raise AnsibleFilterError(str(e)) from e


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"missing_passthrough": missing_passthrough}
