#!/usr/bin/python
"""Documentation of the action plugin mlstack.pve.report_file (plugins/action/report_file.py): it runs on
the controller, in process; there is no module to run."""

from __future__ import annotations

DOCUMENTATION = r"""
module: report_file
short_description: Write a report file on the controller, in process, only when its content differs
description:
  - Writes O(content) to O(dest) on the controller without running a module (an action plugin), so a
    report fetched from a host costs no round trip to save. The parent folders are made (0755).
  - The file is written only when its content or mode differs, through a temporary file renamed over it
    (a reader never sees half a report). Changed exactly then; in check mode nothing is written.
options:
  dest:
    description: The file on the controller.
    type: path
    required: true
  content:
    description: Its text.
    type: str
    required: true
  mode:
    description: Its mode, in octal.
    type: str
    default: "0644"
author: mlstack maintainers
"""

EXAMPLES = r"""
- name: Save the report on the controller
  mlstack.pve.report_file:
    content: "{{ doctor_report | to_nice_json }}\n"
    dest: "{{ playbook_dir }}/../reports/doctor/{{ inventory_hostname }}.json"
"""

RETURN = r"""
dest:
  description: The file written, or left as it was.
  type: str
  returned: always
"""
