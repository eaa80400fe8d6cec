"""Action plugin: the gpu_container preflight's checks of the inventory in one task per group, failing
with every message that applies (module_utils/inventory_check.py says what each check is).

Runs on the controller only: what the node and the API hold was read before and is passed in.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.mlstack.pve.plugins.module_utils import inventory_check as check

# Each group of checks, the arguments it needs (all of them given runs it), and how it is called.
_GROUPS = (
    (("settings",), lambda a: check.node_settings(a["host"], a["settings"])),
    (
        ("settings",),
        lambda a: check.token_settings(
            a["host"], str(a["settings"].get("token_id", "")), bool(a["settings"].get("token_secret_set"))
        ),
    ),
    (("containers",), lambda a: check.container_fields(a["host"], a["containers"])),
    (("containers", "profiles_dir"), lambda a: check.profiles_exist(a["containers"], a["profiles_dir"])),
    (
        ("choices", "profiles_dir"),
        lambda a: check.resources(a["containers"], a["choices"], a["profiles_dir"]),
    ),
    (("locks",), lambda a: check.locks(a["locks"])),
    (("gpu_nodes",), lambda a: check.gpu_selections(a["host"], a["containers"], a["gpu_nodes"])),
    (("all_containers",), lambda a: check.unique(a["all_containers"])),
    (
        ("resolved", "mount_roots"),
        lambda a: check.bind_sources(
            a["host"], a["containers"], a.get("caches", []), a["resolved"], a["mount_roots"]
        ),
    ),
    (("guests", "ours"), lambda a: check.foreign_vmids(a["containers"], a["guests"], a["ours"], a["tag"])),
    (("missing_nodes",), lambda a: check.missing_passthrough_message(a["host"], a["missing_nodes"])),
)
_VALID = frozenset(
    {"host", "settings", "containers", "profiles_dir", "choices", "locks", "gpu_nodes", "all_containers"}
    | {"resolved", "mount_roots", "caches", "guests", "ours", "tag", "missing_nodes"}
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = _VALID

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        args.setdefault("host", (task_vars or {}).get("inventory_hostname", ""))
        args.setdefault("containers", [])
        args.setdefault("tag", "mlstack")
        errors: list[str] = []
        for needs, run in _GROUPS:
            if all(args.get(n) is not None for n in needs):
                try:
                    errors += run(args)
                except (KeyError, TypeError, AttributeError) as e:
                    raise AnsibleActionFail(
                        f"inventory_check: malformed input for {', '.join(needs)}: {e!r}"
                    ) from e
        result.update(changed=False, errors=errors)
        if errors:
            result.update(failed=True, msg="\n".join(errors))
        return result
