"""Filter for the driver userspace check: a container's libcuda against its node's kernel module
(module_utils/driver_userspace.py)."""

from __future__ import annotations

from typing import Any

from ansible_collections.mlstack.pve.plugins.module_utils.driver_userspace import driver_userspace


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"driver_userspace": driver_userspace}
