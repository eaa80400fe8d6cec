"""Action plugin: the gpu_container preflight's checks of the inventory, the ones a task names in
`checks`, failing with every message that applies (module_utils/inventory_check.py says what each check
is and what it needs).

Runs on the controller only: what the node and the API hold was read before and is passed in.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.mlstack.pve.plugins.module_utils import inventory_check as check

_INPUTS = frozenset(
    {"host", "settings", "containers", "profiles_dir", "choices", "locks", "gpu_nodes", "all_containers"}
    | {"resolved", "mount_roots", "caches", "guests", "ours", "tag", "missing_nodes"}
)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = _INPUTS | {"checks"}

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        names = args.pop("checks", None)
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise AnsibleActionFail(
                f"inventory_check: checks must name the checks to run, some of: {', '.join(check.CHECKS)}"
            )
        args.setdefault("host", (task_vars or {}).get("inventory_hostname", ""))
        args.setdefault("containers", [])
        args.setdefault("tag", "mlstack")
        try:
            errors = check.run_checks(names, args)
        except ValueError as e:
            raise AnsibleActionFail(f"inventory_check: {e}") from e
        except (KeyError, TypeError, AttributeError) as e:
            raise AnsibleActionFail(f"inventory_check: malformed input for {', '.join(names)}: {e!r}") from e
        result.update(changed=False, errors=errors)
        if errors:
            result.update(failed=True, msg="\n".join(errors))
        return result
