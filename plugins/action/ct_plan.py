"""Action plugin: which of create, configure and start a container needs, from the guests already read.

Runs on the controller only (no module is sent anywhere): the comparison of a read the role has made
once with what the inventory asks for.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.mlstack.pve.plugins.module_utils.ct_plan import guest_of, plan


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("guests", "vmid", "options"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = self._task.args
        guests, options = args.get("guests"), args.get("options", {})
        try:
            vmid = int(args["vmid"])
        except (KeyError, TypeError, ValueError) as e:
            raise AnsibleActionFail(f"vmid must be an integer: {e}") from e
        if not isinstance(guests, list) or not isinstance(options, dict):
            raise AnsibleActionFail(
                "guests must be a list (proxmox_vm_info's proxmox_vms) and options a dict"
            )
        result.update(changed=False, **plan(guest_of(guests, vmid), options))
        return result
