"""Filter: `pct config` output as a dict, parsed by the same code the pct_config module uses."""

from __future__ import annotations

from typing import Any

from ansible_collections.mlstack.pve.plugins.module_utils.pct import parse_config


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"pct_config_dict": parse_config}
