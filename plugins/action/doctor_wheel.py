"""Action plugin mlstack.pve.doctor_wheel: the doctor's wheel on the controller, built only when its
sources changed, in process (plugins/modules/doctor_wheel.py documents it). The shipped profiles and
policy the doctor carries (its shipped_profiles.json) are written from the collection's profiles/ first,
so a changed profile or rule is a changed source."""

from __future__ import annotations

import os
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.mlstack.pve.plugins.module_utils.controller_run import run_command
from ansible_collections.mlstack.pve.plugins.module_utils.doctor_wheel import ensure_wheel
from ansible_collections.mlstack.pve.plugins.module_utils.stack_packages import STACK
from ansible_collections.mlstack.pve.plugins.module_utils.stack_policy import write_shipped

# Where the doctor carries the shipped profiles, in its sources; and the profiles, beside verify/.
SHIPPED = ("src", "mlstack_doctor", "shipped_profiles.json")
PROFILES = ("..", "profiles")


def run_build(argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    return run_command(argv, env, timeout=600)


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("uv", "src", "dist_dir", "python"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = self._task.args
        uv, src, dist_dir = (str(args.get(k) or "") for k in ("uv", "src", "dist_dir"))
        if not (uv and src and dist_dir):
            raise AnsibleActionFail("uv, src and dist_dir are required")
        if not os.path.isfile(uv):
            python = args.get("python") or "python3"
            raise AnsibleActionFail(
                f"The doctor's wheel is built on the controller with uv, and {uv} does not exist. Install it"
                f" beside the Python that runs Ansible (`{python} -m pip install uv`; the checkout's"
                " `make venv` does), or set doctor_controller_uv to its path."
            )
        src = os.path.realpath(src)
        profiles = os.path.normpath(os.path.join(src, *PROFILES))
        if not os.path.isdir(profiles):
            raise AnsibleActionFail(
                f"The doctor carries the stack profiles it judges by, read from {profiles} beside its sources"
                f" ({src}), and there is no such folder: src must be the collection's verify/."
            )
        try:
            write_shipped(profiles, os.path.join(src, *SHIPPED), STACK)
            found = ensure_wheel(uv, src, dist_dir, run_build)
        except (ValueError, OSError) as e:
            raise AnsibleActionFail(f"Building the doctor's wheel failed: {e}") from e
        # Controller build output, not managed state.
        result.update(changed=False, **found)
        return result
