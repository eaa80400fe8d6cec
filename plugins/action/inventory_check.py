"""Action plugin: the inventory's checks, the ones a task names in `checks`, failing with every message
that applies (module_utils/inventory_check.py says what each check is and what it needs).

Runs on the controller: what the node and the API hold was read before and is passed in. The one
exception: `entries` found mistakes, an entry lists GPU indices and no `gpu_nodes` were given; the node's
device nodes are then read (mlstack.pve.node_state on the task's host) so the run lists every mistake.
"""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.mlstack.pve.plugins.module_utils import inventory_check as check
from ansible_collections.mlstack.pve.plugins.module_utils import inventory_entries
from ansible_collections.mlstack.pve.plugins.module_utils.controller_run import run_command

_INPUTS = frozenset(
    {"host", "settings", "containers", "profiles_dir", "choices", "locks", "gpu_nodes", "inventory"}
    | {"resolved", "mount_roots", "caches", "guests", "ours", "tag", "missing_nodes", "uv"}
)


def run_uv(argv: list[str]) -> tuple[int, str, str]:
    """A uv command on the controller, without its progress bars."""
    return run_command(argv, {"UV_NO_PROGRESS": "1"})


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
        # `uv` given (and no `locks`): the locks check runs `uv lock --check` here, in process, for each
        # profile the choices name; an empty `uv` checks none.
        uv = args.pop("uv", None)
        if uv is not None and args.get("locks") is None:
            profiles = [c.get("profile") for c in (args.get("choices") or {}).values() if isinstance(c, dict)]
            args["locks"] = (
                check.lock_results(str(uv), str(args.get("profiles_dir")), profiles, run_uv) if uv else {}
            )
        try:
            errors = check.run_checks(names, args)
            # The entries' mistakes stop the run: where an entry lists GPU indices and the node's device
            # nodes are not known yet (before any role reads the node), read them now, so that a GPU the
            # node lacks is listed with the rest instead of at the next run.
            if errors and "entries" in names and args.get("gpu_nodes") is None:
                if inventory_entries.asks_indices(args.get("containers")):
                    args["gpu_nodes"] = self._device_nodes(task_vars or {})
                    if args["gpu_nodes"] is not None:
                        errors = check.run_checks(names, args)
        except ValueError as e:
            raise AnsibleActionFail(f"inventory_check: {e}") from e
        except (KeyError, TypeError, AttributeError) as e:
            raise AnsibleActionFail(f"inventory_check: malformed input for {', '.join(names)}: {e!r}") from e
        result.update(changed=False, errors=errors)
        if errors:
            result.update(failed=True, msg="\n".join(errors))
        return result

    def _device_nodes(self, task_vars: dict[str, Any]) -> list[str] | None:
        """The node's device nodes, read on it by mlstack.pve.node_state (what pve_host reads them with); None
        where they cannot be read (the run stops on the other mistakes anyway, and the preflight names the
        node's trouble once they are fixed)."""
        read = self._execute_module(
            module_name="mlstack.pve.node_state", module_args={"gather": ["devices"]}, task_vars=task_vars
        )
        if read.get("failed") or read.get("unreachable"):
            return None
        return list(read.get("gpu_nodes") or [])
