"""Action plugin mlstack.pve.report_file: write a report on the controller in process, only when its
content differs (plugins/modules/report_file.py documents it)."""

from __future__ import annotations

import os
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase
from ansible_collections.mlstack.pve.plugins.module_utils.report_files import write_if_changed


def file_mode(value: Any) -> int:
    """An octal mode as a task gives it ("0644", "644" or an int already read as octal)."""
    if isinstance(value, int):
        return value
    try:
        return int(str(value), 8)
    except ValueError:
        raise AnsibleActionFail(f"mode must be octal digits, like 0644 (got {value!r})") from None


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("dest", "content", "mode"))

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = self._task.args
        if not args.get("dest") or "content" not in args:
            raise AnsibleActionFail("dest and content are required")
        dest = os.path.expanduser(str(args["dest"]))
        content = str(args["content"])
        try:
            changed = write_if_changed(
                dest, content, file_mode(args.get("mode", "0644")), check=self._task.check_mode
            )
        except OSError as e:
            raise AnsibleActionFail(f"cannot write {dest}: {e.strerror or e}") from e
        result.update(changed=changed, dest=dest)
        return result
