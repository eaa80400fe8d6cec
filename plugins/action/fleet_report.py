"""Action plugin mlstack.pve.fleet_report: the fleet report in one controller-side step, no module run
(plugins/modules/fleet_report.py documents it). It reads the previous fleet.json, compares this run's
rows with it (the drift view), lists the driver userspace mismatches, renders the role's fleet.md
template and writes fleet.json and fleet.md, each only when its content differs."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime
from typing import Any

from ansible.errors import AnsibleActionFail, AnsibleError
from ansible.plugins.action import ActionBase
from ansible.template import trust_as_template
from ansible_collections.mlstack.pve.plugins.filter.report import fleet_drift
from ansible_collections.mlstack.pve.plugins.filter.userspace import userspace_mismatches
from ansible_collections.mlstack.pve.plugins.module_utils.report_files import read_text, write_if_changed


def fleet_document(rows: list[dict[str, Any]], previous: str | None, generated: str) -> dict[str, Any]:
    """fleet.json's content: this run's rows, what changed since the previous report, the mismatches."""
    return {
        "generated": generated,
        "containers": rows,
        "drift": fleet_drift(rows, previous or ""),
        "userspace_mismatches": userspace_mismatches(rows),
    }


def as_json(doc: dict[str, Any]) -> str:
    """As the to_nice_json filter writes it, and a final newline."""
    return json.dumps(doc, indent=4, sort_keys=True, separators=(",", ": ")) + "\n"


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _VALID_ARGS = frozenset(("dir", "rows", "template"))

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
        args = self._task.args
        if not args.get("dir"):
            raise AnsibleActionFail("dir is required")
        rows = args.get("rows") or []
        if not isinstance(rows, list) or not all(isinstance(r, dict) and "container" in r for r in rows):
            raise AnsibleActionFail("rows must be a list of dicts, each with a container")
        folder = os.path.expanduser(str(args["dir"]))
        json_path, md_path = os.path.join(folder, "fleet.json"), os.path.join(folder, "fleet.md")

        generated = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        doc = fleet_document(rows, read_text(json_path), generated)
        markdown = self._render(str(args.get("template") or "fleet.md.j2"), task_vars or {}, doc)

        check = bool(self._task.check_mode)
        try:
            written = {
                "fleet.json": write_if_changed(json_path, as_json(doc), check=check),
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
