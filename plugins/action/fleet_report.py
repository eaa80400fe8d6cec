"""Action plugin mlstack.pve.fleet_report: the fleet report in one controller-side step, no module run
(plugins/modules/fleet_report.py documents it). It builds one row per container of `group` from that
host's variables, reads the previous fleet.json, compares (the drift view), lists the driver userspace
mismatches (module_utils/fleet.py), renders the role's fleet.md template and writes fleet.json and
fleet.md, each only when its content differs."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from typing import Any

from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.plugins.action import ActionBase
from ansible.template import trust_as_template
from ansible_collections.mlstack.pve.plugins.module_utils import fleet
from ansible_collections.mlstack.pve.plugins.module_utils.report_files import read_text, write_if_changed


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("dir", "group", "template"))

    def _rows(self, group: str, task_vars: dict[str, Any]) -> list[dict[str, Any]]:
        """One row per host of the group, in the inventory's order, from that host's variables."""
        hostvars = task_vars.get("hostvars") or {}
        names = (task_vars.get("groups") or {}).get(group) or []
        return [fleet.row(name, hostvars[name]) for name in names]

    def _render(self, name: str, task_vars: dict[str, Any], doc: dict[str, Any]) -> str:
        """The role's template, as ansible.builtin.template renders it (trim_blocks, "\\n" newlines)."""
        try:
            source = self._find_needle("templates", name)
        except AnsibleError as e:
            raise AnsibleActionFail(str(e)) from e
        template = trust_as_template(self._loader.get_text_file_contents(source))
        variables = dict(
            task_vars,
            _fleet_report_rows=doc["containers"],
            _fleet_report_drift=doc["drift"],
            _fleet_report_mismatches=doc["userspace_mismatches"],
        )
        templar = self._templar.copy_with_new_env(
            searchpath=[os.path.dirname(source)], available_variables=variables
        )
        overrides = {"trim_blocks": True, "lstrip_blocks": False, "newline_sequence": "\n"}
        return templar.template(template, escape_backslashes=False, overrides=overrides) or ""

    def run(self, tmp: Any = None, task_vars: dict[str, Any] | None = None) -> dict[str, Any]:
        result = super().run(tmp, task_vars)
        task_vars = task_vars or {}
        args = self._task.args
        if not args.get("dir"):
            raise AnsibleActionFail("dir is required")
        if not isinstance(args.get("group", "mlstack_containers"), str):
            raise AnsibleActionFail("group must be the name of an inventory group")
        folder = os.path.expanduser(str(args["dir"]))
        json_path, md_path = os.path.join(folder, "fleet.json"), os.path.join(folder, "fleet.md")

        rows = self._rows(str(args.get("group", "mlstack_containers")), task_vars)
        generated = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        doc = fleet.document(rows, read_text(json_path), generated)
        markdown = self._render(str(args.get("template") or "fleet.md.j2"), task_vars, doc)

        check = bool(self._task.check_mode)
        try:
            written = {
                "fleet.json": write_if_changed(json_path, fleet.as_json(doc), check=check),
                "fleet.md": write_if_changed(md_path, markdown, check=check),
            }
        except OSError as e:
            raise AnsibleActionFail(f"cannot write the fleet report in {folder}: {e.strerror or e}") from e
        result.update(
            changed=any(written.values()),
            written=[name for name, changed in written.items() if changed],
            generated=generated,
            drift=doc["drift"],
            userspace_mismatches=doc["userspace_mismatches"],
            markdown=markdown,
        )
        return result
