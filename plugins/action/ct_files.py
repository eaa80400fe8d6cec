"""Action plugin mlstack.pve.ct_files: each `sources` file whose item is written is read on the controller
(a binary file too, such as a wheel) and sent in base64 with the module's arguments, beside `contents`;
the module (plugins/modules/ct_files.py documents it) writes on the target in the same round trip."""

from __future__ import annotations

import base64
import os
from typing import Any

from ansible.errors import AnsibleActionFail
from ansible.plugins.action import ActionBase

MODULE = "mlstack.pve.ct_files"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        args = dict(self._task.args)
        sources = args.pop("sources", None) or {}
        items = args.get("items") or {}
        if not isinstance(sources, dict) or not isinstance(items, dict):
            raise AnsibleActionFail("items and sources must be dicts by item key")
        encoded: dict[str, str] = {}
        sizes: dict[str, str] = {}
        for key, path in sources.items():
            if key not in items:  # an item that needs no writing is not read, nor sent
                continue
            try:
                with open(os.path.expanduser(str(path)), "rb") as f:
                    data = f.read()
            except OSError as e:
                raise AnsibleActionFail(
                    f"{key}: cannot read {path} on the controller: {e.strerror or e}"
                ) from e
            encoded[key] = base64.b64encode(data).decode("ascii")
            sizes[key] = f"{len(data)} bytes from {path}"
        if encoded:
            args["contents_base64"] = {**(args.get("contents_base64") or {}), **encoded}
        result.update(self._execute_module(module_name=MODULE, module_args=args, task_vars=task_vars))
        # -vvv shows the module's arguments: the files' sizes there, not their base64.
        shown = result.get("invocation", {}).get("module_args")
        if isinstance(shown, dict) and encoded:
            shown.update(sources=sources, contents_base64=sizes)
        return result
