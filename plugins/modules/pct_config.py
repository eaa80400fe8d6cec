#!/usr/bin/python
"""Ansible module: make a PVE container's settings, devN/mpN keys and disk what the inventory states (pct)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pct_config
short_description: Make a PVE container's settings, devN and mpN keys and disk size what the inventory states
description:
  - Runs on the PVE node. Reads C(pct status) and C(pct pending), compares the devN and mpN keys with
    O(options), the settings with O(settings) (a property list or tags only on what they name) and the
    root disk with O(disk_gb), and calls C(pct set) (and C(pct resize rootfs)) only for what differs, so
    a rerun reports no change.
  - PVE allows devN and bind mpN only to root@pam; API tokens are refused for them, hence pct on the node.
  - A running container takes some changes at once and keeps others pending until its next start, as
    PVE decides; RV(restart_needed) is read back from PVE after the change. Restarting is not done here
    (mlstack.pve.pct_start with O(mlstack.pve.pct_start#module:restart=true)).
  - A root disk is never shrunk; a smaller O(disk_gb) fails, naming both sizes, before any change.
options:
  vmid:
    description: Container ID.
    type: int
    required: true
  options:
    description:
      - Desired keys, e.g. C(dev0) -> C(/dev/nvidia0,gid=44,mode=0666), C(mp0) -> C(/host,mp=/ct,ro=1), and the
        guest hookscript, C(hookscript) -> C(local:snippets/mlstack-gpu-hook) (never purged).
    type: dict
    required: true
  settings:
    description:
      - Settings the inventory states, by PVE key (cores, memory, swap, hostname, onboot, description,
        tags, features, net0); keys not given are left as they are.
    type: dict
    default: {}
  disk_gb:
    description: Root disk size in GiB; grown with C(pct resize) when larger than the container's. Unset leaves it.
    type: int
  purge:
    description: Delete devN/mpN keys that are not in O(options).
    type: bool
    default: true
author: mlstack maintainers
"""

EXAMPLES = r"""
- name: Pass the GPUs through, bind the caches and give the container 3 GiB
  mlstack.pve.pct_config:
    vmid: 120
    options:
      dev0: /dev/nvidia0,gid=44,mode=0666
      mp0: /var/lib/mlstack/cache/uv,mp=/var/cache/mlstack/uv
    settings:
      memory: "3072"
    disk_gb: 24
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
resized:
  description: The size the root disk was (or would be) grown to, e.g. C(24G); empty when not.
  type: str
  returned: always
changes:
  description: Each changed setting by its inventory name, with C(old), C(new) and C(applies) (C(live) or C(at the next start)).
  type: dict
  returned: always
restart_needed:
  description: Settings whose change waits for the container's next start (PVE's pending changes).
  type: list
  returned: always
"""

import re

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.mlstack.pve.plugins.module_utils.ct_plan import reconcile
from ansible_collections.mlstack.pve.plugins.module_utils.pct import (
    MANAGED_KEY,
    OPTION_KEY,
    SETTING_KEY,
    parse_pending,
    pending_command,
    resize_command,
    set_command,
    status_command,
)

# argv is never a shell, but these values also reach PVE's property-string parser: nothing else than
# what PVE's formats allow gets that far. A description is free text on one line.
_UNSAFE = re.compile(r"[\s;&|`$<>\\'\"]")
_UNSAFE_TEXT = re.compile(r"[\x00-\x1f]")
# PVE's tags, joined by ';'.
_UNSAFE_TAGS = re.compile(r"[^A-Za-z0-9_.+;-]")
_UNSAFE_BY_KEY = {"description": _UNSAFE_TEXT, "tags": _UNSAFE_TAGS}


def refused_values(options: dict[str, str], settings: dict[str, str]) -> list[str]:
    """What this module will not pass on, as messages."""
    out = []
    bad = sorted(k for k in options if not OPTION_KEY.match(k)) + sorted(
        k for k in settings if not SETTING_KEY.match(k)
    )
    if bad:
        out.append(f"not a devN/mpN key, the hookscript or a managed setting: {', '.join(bad)}")
    unsafe = sorted(k for k, v in {**options, **settings}.items() if _UNSAFE_BY_KEY.get(k, _UNSAFE).search(v))
    if unsafe:
        out.append(f"refusing values with whitespace or shell metacharacters for: {', '.join(unsafe)}")
    return out


def diff_text(config: dict[str, str], keys: list[str]) -> str:
    return "".join(f"{k}: {config[k]}\n" for k in sorted(keys) if config.get(k) is not None)


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "vmid": {"type": "int", "required": True},
            "options": {"type": "dict", "required": True},
            "settings": {"type": "dict", "default": {}},
            "disk_gb": {"type": "int"},
            "purge": {"type": "bool", "default": True},
        },
        supports_check_mode=True,
    )
    vmid = module.params["vmid"]
    options = {str(k): str(v) for k, v in module.params["options"].items()}
    settings = {str(k): str(v) for k, v in module.params["settings"].items()}
    refused = refused_values(options, settings)
    if refused:
        module.fail_json(msg="; ".join(refused))

    def run(argv: list[str]) -> str:
        rc, out, err = module.run_command(argv)
        if rc != 0:
            module.fail_json(msg=f"pct {argv[1]} {vmid} failed: {err.strip() or out.strip()}", rc=rc)
        return out

    running = "status: running" in run(status_command(vmid))
    current, view = parse_pending(run(pending_command(vmid)))
    if not module.params["purge"]:
        options = {**{k: v for k, v in view.items() if MANAGED_KEY.match(k)}, **options}
    found = reconcile(current, view, running, options, settings, module.params["disk_gb"])
    if found["refused"]:
        module.fail_json(msg=f"CT {vmid}: {found['refused']} Nothing was changed.")
    to_set, to_delete, resize = found["set"], found["deleted"], found["resize"]
    changed = bool(to_set or to_delete or resize)
    after = {**{k: v for k, v in view.items() if k not in to_delete}, **to_set}
    if resize:
        after["rootfs"] = re.sub(r"size=[^,]*", f"size={resize}", view.get("rootfs", ""))
    touched = [*to_set, *to_delete, *(["rootfs"] if resize else [])]
    diff = {"before": diff_text(view, touched), "after": diff_text(after, touched)}
    restart_needed = found["restart_needed"]
    if changed and not module.check_mode:
        if to_set or to_delete:
            run(set_command(vmid, to_set, to_delete))
        if resize:
            run(resize_command(vmid, resize))
        # PVE's own answer: what it applied at once and what waits for the next start.
        done = reconcile(*parse_pending(run(pending_command(vmid))), running, options, settings, None)
        restart_needed = done["restart_needed"]
    module.exit_json(
        changed=changed,
        set=to_set,
        deleted=to_delete,
        resized=resize,
        changes=found["changes"],
        restart_needed=restart_needed,
        diff=diff,
    )


if __name__ == "__main__":
    main()
