"""Action plugin: which of create, configure, resize, start and restart a container needs, from the guests
already read, and what would change in it.

Runs on the controller only (no module is sent anywhere): the comparison of a read the role has made
once with what the inventory asks for.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.module_utils.parsing.convert_bool import boolean
from ansible.plugins.action import ActionBase
from ansible_collections.mlstack.pve.plugins.module_utils import ct_settings
from ansible_collections.mlstack.pve.plugins.module_utils.ct_plan import describe, guest_of, plan


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(
        ("guests", "pending", "vmid", "options", "entry", "node", "profile", "allow_restart")
    )

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = self._task.args
        guests, options = args.get("guests"), args.get("options", {})
        entry, node = args.get("entry") or {}, args.get("node") or {}
        try:
            vmid = int(args["vmid"])
        except (KeyError, TypeError, ValueError) as e:
            raise AnsibleActionFail(f"vmid must be an integer: {e}") from e
        if not isinstance(guests, list) or not isinstance(options, dict):
            raise AnsibleActionFail("guests must be a list (pve_guests' proxmox_vms) and options a dict")
        if not isinstance(entry, dict) or not isinstance(node, dict):
            raise AnsibleActionFail("entry (the inventory's container) and node must be dicts")
        allow_restart = boolean(args.get("allow_restart", False))
        # Without the node's settings only devN/mpN are compared (as before settings were reconciled).
        stated = ct_settings.stated(entry, node) if node else {}
        planned = plan(
            guest_of(guests, vmid),
            options,
            stated,
            entry.get("disk_gb"),
            guest_of(args.get("pending"), vmid),
            allow_restart,
        )
        refused = ct_settings.check_entry(entry)
        if planned["refused"]:
            refused.append(f"Container {vmid}: {planned['refused']}")
        planned["refused"] = " ".join(refused)
        planned["stated"] = stated
        if node:
            planned["create_args"] = ct_settings.create_args(entry, node, str(args.get("profile", "")))
        # Whether any step (create, configure, start, restart) is needed: a container that needs none is
        # only connected to.
        planned["needed"] = any(bool(planned.get(k)) for k in ("create", "configure", "start", "restart"))
        planned["summary"] = describe(vmid, str(node.get("name", "its node")), planned, allow_restart)
        if planned["create"] and args.get("profile"):
            planned["summary"].append(
                f"CT {vmid}: then install its stack inside (toolchain, NVIDIA userspace, the venv of profile"
                f" {args['profile']}) and verify it (doctor)"
            )
        result.update(changed=False, vmid=vmid, **planned)
        return result
