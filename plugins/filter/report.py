"""Filter for the fleet report's template: a stack cell (module_utils/fleet.py builds the rows)."""

from __future__ import annotations

from typing import Any

from ansible_collections.mlstack.pve.plugins.module_utils.fleet import stack_cell


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"stack_cell": stack_cell}
