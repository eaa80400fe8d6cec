#!/usr/bin/python
"""Ansible module: make a PVE container's devN and mpN keys equal a desired set, via `pct set`."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pct_config
short_description: Set device passthrough (devN) and bind mounts (mpN) of a PVE container
description:
  - Runs on the PVE node. Reads C(pct config), compares the devN and mpN keys with O(options)
    and calls C(pct set) only for what differs, so a rerun reports no change.
  - PVE allows these keys only to root@pam; API tokens are refused for them, hence pct on the node.
options:
  vmid:
    description: Container ID.
    type: int
    required: true
  options:
    description: Desired keys, e.g. C(dev0) -> C(/dev/nvidia0,gid=44,mode=0666), C(mp0) -> C(/host,mp=/ct,ro=1).
    type: dict
    required: true
  purge:
    description: Delete devN/mpN keys that are not in O(options).
    type: bool
    default: true
author: mlstack maintainers
"""

EXAMPLES = r"""
- name: Pass the GPUs through and bind the caches
  mlstack.pve.pct_config:
    vmid: 120
    options:
      dev0: /dev/nvidia0,gid=44,mode=0666
      mp0: /var/lib/mlstack/cache/uv,mp=/var/cache/mlstack/uv
"""

RETURN = r"""
set:
  description: Keys that were (or in check mode would be) written.
  type: dict
  returned: always
deleted:
  description: Keys that were (or would be) deleted.
  type: list
  returned: always
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.mlstack.pve.plugins.module_utils.pct import (
    MANAGED_KEY,
    PCT,
    parse_config,
    plan_changes,
    set_command,
)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "vmid": {"type": "int", "required": True},
            "options": {"type": "dict", "required": True},
            "purge": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    vmid = module.params["vmid"]
    desired = {str(k): str(v) for k, v in module.params["options"].items()}
    bad = sorted(k for k in desired if not MANAGED_KEY.match(k))
    if bad:
        module.fail_json(msg=f"only devN and mpN keys are managed here, not: {', '.join(bad)}")
    unsafe = sorted(k for k, v in desired.items() if re.search(r"[\s;&|`$<>\\'\"]", v))
    if unsafe:
        module.fail_json(
            msg=f"refusing values with whitespace or shell metacharacters for: {', '.join(unsafe)}"
        )

    rc, out, err = module.run_command([PCT, "config", str(vmid)])
    if rc != 0:
        module.fail_json(msg=f"pct config {vmid} failed: {err.strip() or out.strip()}", rc=rc)
    to_set, to_delete = plan_changes(parse_config(out), desired, module.params["purge"])
    changed = bool(to_set or to_delete)
    if changed and not module.check_mode:
        rc, out, err = module.run_command(set_command(vmid, to_set, to_delete))
        if rc != 0:
            module.fail_json(msg=f"pct set {vmid} failed: {err.strip() or out.strip()}", rc=rc)
    module.exit_json(changed=changed, set=to_set, deleted=to_delete)


if __name__ == "__main__":
    main()
