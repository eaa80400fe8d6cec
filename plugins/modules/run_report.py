#!/usr/bin/python
"""Ansible module: run a command that writes a JSON report and return its output and the report."""

from __future__ import annotations

DOCUMENTATION = r"""
module: run_report
short_description: Run a command that writes a JSON report, and read the report, in one round trip
description:
  - Runs O(argv) (no shell) where the task runs, then reads the JSON report it wrote at O(report) and
    returns it parsed, with the command's exit code and output as M(ansible.builtin.command) returns them.
    A run and a read of its report cost one module run instead of two (a command and a slurp).
  - Never fails on the command's exit code, and changes nothing of its own; the task decides with
    C(failed_when) and C(changed_when).
  - Where O(argv)'s first word is a path that is missing or not executable, nothing runs, V(rc) is 127
    and RV(missing) says why.
  - With O(unless_differs), the same round trip first reads those items as M(mlstack.pve.ct_state) does,
    and runs the command only where none differs (RV(ran)); a caller that installs the command checks the
    install and runs it in one call. In check mode the items are read and nothing runs.
options:
  argv:
    description: The command and its arguments.
    type: list
    elements: str
    required: true
  report:
    description: The JSON report the command writes (a JSON object).
    type: path
    required: true
  read_on:
    description: Exit codes after which the report is read; after any other, RV(report) is V(null).
    type: list
    elements: int
    default: [0, 1]
  unless_differs:
    description:
      - Items as M(mlstack.pve.ct_state) takes them, read before the command; where one differs, nothing runs.
    type: dict
author: mlstack maintainers
"""

EXAMPLES = r"""
- name: Run the doctor and read its report
  mlstack.pve.run_report:
    argv: [/opt/mlstack/venv/bin/mlstack-doctor, --tier, fast, --output, /var/lib/mlstack/doctor/report.json]
    report: /var/lib/mlstack/doctor/report.json
  register: _run
  changed_when: false
  failed_when: _run.rc not in [0, 1] or _run.report is none
"""

RETURN = r"""
ran:
  description: Whether the command ran (false where an item of O(unless_differs) differs, or in check mode).
  type: bool
  returned: always
found:
  description: What each item of O(unless_differs) was found to be, as M(mlstack.pve.ct_state) says it.
  type: dict
  returned: always
differs:
  description: For each item of O(unless_differs) not in the wanted state, why.
  type: dict
  returned: always
rc:
  description: The command's exit code (127 when it could not be started).
  type: int
  returned: where it ran
stdout:
  description: Its standard output, one trailing newline dropped.
  type: str
  returned: always
stdout_lines:
  description: The same, line by line.
  type: list
  returned: always
stderr:
  description: Its standard error (why it could not start, where it could not).
  type: str
  returned: always
missing:
  description: Why the command could not be started, or V(null).
  type: str
  returned: always
report:
  description: The report, parsed; V(null) where the exit code is not in O(read_on) or the file is unusable.
  type: dict
  returned: always
report_error:
  description: Why RV(report) is V(null), or V(null).
  type: str
  returned: always
root_causes:
  description:
    - A doctor report's root causes, one per independent failure, each with C(probe), C(code) and C(fix).
      They are C(summary.root_causes), or the single C(summary.root_cause) of a 1.0 report; V([]) when none.
  type: list
  elements: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.mlstack.pve.plugins.module_utils.ct_state import read_state
from ansible_collections.mlstack.pve.plugins.module_utils.run_report import not_run, run_and_read


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "argv": {"type": "list", "elements": "str", "required": True},
            "report": {"type": "path", "required": True},
            "read_on": {"type": "list", "elements": "int", "default": [0, 1]},
            "unless_differs": {"type": "dict"},
        },
        supports_check_mode=True,
    )

    def run(argv: list[str]) -> tuple[int, str, str]:
        return module.run_command(argv)

    p = module.params
    state = read_state(p["unless_differs"] or {})
    if state["differs"] or module.check_mode:
        module.exit_json(changed=False, ran=False, **state, **not_run())
    result = run_and_read(p["argv"], p["report"], run, tuple(p["read_on"]))
    module.exit_json(changed=False, ran=True, **state, **result)


if __name__ == "__main__":
    main()
