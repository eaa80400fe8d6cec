#!/usr/bin/python
"""Documentation of the action plugin mlstack.pve.fleet_report (plugins/action/fleet_report.py): it runs
on the controller, in process; there is no module to run."""

from __future__ import annotations

DOCUMENTATION = r"""
module: fleet_report
short_description: Write the fleet report (fleet.json, fleet.md) in one controller-side step
description:
  - Builds one row per container of the inventory group O(group) from that host's variables - C(mlstack_pve_host),
    C(proxmox_vmid), the stack (C(mlstack_container) with the stack policy's C(mlstack_stack_choice)), the doctor's
    C(doctor_report) (its stage verdicts, root cause and the stack it saw) and the driver userspace check
    C(nvidia_userspace_check).
  - Reads the previous C(fleet.json) in O(dir), compares the rows with it (the drift view), lists the containers
    whose driver userspace differs from their node, renders O(template) (the fleet_report role's C(fleet.md.j2),
    with C(_fleet_report_rows), C(_fleet_report_drift) and C(_fleet_report_mismatches)) and writes
    C(fleet.json) and C(fleet.md). No module runs, so reading, comparing and writing cost no round trip.
  - Each file is written only when its content differs, through a temporary file renamed over it.
    Changed when a file's content changed; C(fleet.json)'s C(generated) time makes that every run, which
    is why the role counts the report as the run's output (C(changed_when) false). In check mode nothing
    is written.
options:
  dir:
    description: Controller folder of the report (made when missing).
    type: path
    required: true
  group:
    description: The inventory group of the containers to report on; a group the inventory lacks reports none.
    type: str
    default: mlstack_containers
  template:
    description: The Markdown template, looked up in the role's C(templates) folder.
    type: str
    default: fleet.md.j2
author: mlstack maintainers
"""

EXAMPLES = r"""
- name: Write the fleet report
  mlstack.pve.fleet_report:
    dir: "{{ playbook_dir }}/../reports"
    group: mlstack_containers
  register: _fleet_report_out
"""

RETURN = r"""
written:
  description: The files whose content changed (C(fleet.json), C(fleet.md)).
  type: list
  elements: str
  returned: always
generated:
  description: This report's time (UTC, C(YYYY-MM-DDTHH:MM:SSZ)), as fleet.json records it.
  type: str
  returned: always
drift:
  description: What changed per container since the previous report (fleet.json's C(drift)).
  type: dict
  returned: always
userspace_mismatches:
  description: The containers whose driver userspace differs from their node (fleet.json's list).
  type: list
  elements: dict
  returned: always
markdown:
  description: fleet.md's text.
  type: str
  returned: always
"""
