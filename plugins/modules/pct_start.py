#!/usr/bin/python
"""Ansible module: start a PVE container with `pct start` and report PVE's reason when it refuses."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pct_start
short_description: Start a PVE container and say why when PVE refuses
description:
  - Runs on the PVE node. Does nothing when C(pct status) says the container runs; otherwise runs
    C(pct start) and, when it fails, fails with PVE's own words (for example
    C(Device /dev/nvidia1 does not exist)) and what fixes them.
  - Unlike an API start polled until a timeout, a refused start fails at once with its reason.
options:
  vmid:
    description: Container ID.
    type: int
    required: true
  restart:
    description:
      - Restart a running container (C(pct reboot)), so that the changes PVE keeps pending until its next
        start take effect; a refused start fails as a refused C(pct start) does. A stopped one is started.
    type: bool
    default: false
author: mlstack maintainers
"""

EXAMPLES = r"""
- name: Start container 120
  mlstack.pve.pct_start:
    vmid: 120

- name: Restart container 120 for its pending changes
  mlstack.pve.pct_start:
    vmid: 120
    restart: true
"""

RETURN = r"""
reason:
  description: PVE's output when the start failed.
  type: str
  returned: failure
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.mlstack.pve.plugins.module_utils.pct import (
    explain_start_failure,
    reboot_command,
    start_command,
    status_command,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "vmid": {"type": "int", "required": True},
            "restart": {"type": "bool", "default": False},
        },
        supports_check_mode=True,
    )
    vmid = module.params["vmid"]
    rc, out, err = module.run_command(status_command(vmid))
    if rc != 0:
        module.fail_json(msg=f"pct status {vmid} failed: {err.strip() or out.strip()}", rc=rc)
    running = "status: running" in out
    if running and not module.params["restart"]:
        module.exit_json(changed=False)
    if module.check_mode:
        module.exit_json(changed=True)
    rc, out, err = module.run_command(reboot_command(vmid) if running else start_command(vmid))
    if rc != 0:
        reason = "\n".join(t for t in (err.strip(), out.strip()) if t)
        fix = explain_start_failure(reason)
        lines = reason.splitlines()[-6:]
        msg = f"CT {vmid} did not start. PVE said: {' | '.join(lines) or f'exit {rc}'}."
        module.fail_json(msg=f"{msg} {fix}" if fix else msg, reason=reason, rc=rc)
    module.exit_json(changed=True)


if __name__ == "__main__":
    main()
