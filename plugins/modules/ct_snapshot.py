#!/usr/bin/python
"""Ansible module: take, list, prune and restore the project's PVE snapshots of a container (PVE API)."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ct_snapshot
short_description: Take, list, prune and restore this project's PVE snapshots of a container
description:
  - Talks to the PVE API with community.proxmox's connection options (a token or a password), on the
    controller. Each state does one thing; a refused PVE task fails at once with PVE's own words (for
    example C(snapshot feature is not available)) and what fixes them.
  - A snapshot is this project's when its name starts with C(mlstack-) and its description with
    C(mlstack upgrade snapshot); C(pruned) and C(rollback) never act on anyone else's.
  - In check mode nothing is changed; the C(listed) read runs.
options:
  node:
    description: PVE node of the container.
    type: str
    required: true
  vmid:
    description: Container ID.
    type: int
    required: true
  state:
    description:
      - C(listed) reads the snapshots and says which one a rollback to O(name) would restore (O(name)
        empty means the project's newest); C(present) takes one, named after the profile of O(venv) and the
        UTC minute, its description holding O(venv) and the time (one of that name already taken this
        minute is kept); C(pruned) removes the project's snapshots beyond the newest O(keep);
        C(rollback) restores O(name) and starts the container when O(start).
    type: str
    choices: [listed, present, pruned, rollback]
    required: true
  name:
    description: Snapshot name (C(rollback); C(listed), to say whether it can be restored).
    type: str
    default: ""
  venv:
    description: The venv id (profile and lock hash) the container runs, which C(present) records; empty when none.
    type: str
    default: ""
  keep:
    description: How many of the project's snapshots C(pruned) keeps, newest first.
    type: int
    default: 3
  start:
    description: Start the container after C(rollback).
    type: bool
    default: true
  timeout:
    description: Seconds to wait for each PVE task.
    type: int
    default: 300
extends_documentation_fragment:
  - community.proxmox.proxmox.actiongroup_proxmox
  - community.proxmox.proxmox.documentation
author: mlstack maintainers
"""

EXAMPLES = r"""
- name: Take a snapshot of container 120
  mlstack.pve.ct_snapshot:
    api_host: pve1
    api_user: root@pam
    api_token_id: mlstack
    api_token_secret: "{{ vault_token }}"
    node: pve1
    vmid: 120
    state: present
    venv: torch211-triton36-0123456789ab
"""

RETURN = r"""
name:
  description: The snapshot taken (C(present)).
  type: str
  returned: when state is present
chosen:
  description: The snapshot a rollback to O(name) restores, as in RV(ours); empty when none can be.
  type: dict
  returned: when state is listed
unavailable:
  description: Why no snapshot can be restored (C(listed)); empty when one can.
  type: str
  returned: when state is listed
snapshots:
  description: The container's snapshots (without PVE's C(current)) after the change.
  type: list
  elements: dict
  returned: always
ours:
  description: The project's snapshots, newest first, each with name, snaptime, description, venv, taken.
  type: list
  elements: dict
  returned: always
removed:
  description: Names C(pruned) removed (or would remove, in check mode).
  type: list
  elements: str
  returned: always
"""

from datetime import UTC, datetime
from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.community.proxmox.plugins.module_utils.proxmox import (
    ProxmoxAnsible,
    proxmox_auth_argument_spec,
)
from ansible_collections.mlstack.pve.plugins.module_utils.snapshots import (
    VALID_NAME,
    chosen,
    description,
    explain,
    ours,
    snapshot_name,
    to_prune,
)


class Snapshots(ProxmoxAnsible):
    """The snapshot endpoints of one container."""

    def __init__(self, module: AnsibleModule) -> None:
        super().__init__(module)
        self.node: str = module.params["node"]
        self.vmid: int = module.params["vmid"]
        self.api = self.proxmox_api.nodes(self.node).lxc(self.vmid).snapshot

    def listed(self) -> list[dict[str, Any]]:
        found = self.call(f"list the snapshots of CT {self.vmid}", self.api.get)
        return [s for s in found if s.get("name") != "current"]

    def call(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """One API call; a refusal fails the module with PVE's words."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # proxmoxer raises its ResourceException or requests' errors
            self.module.fail_json(msg=explain(what, str(e)))

    def run_task(self, what: str, fn: Any, *args: Any, **kwargs: Any) -> None:
        """A call that starts a PVE task, and the wait for it: a failed task fails with its exit status."""
        upid = self.call(what, fn, *args, **kwargs)
        ok, status = self.api_task_complete(self.node, upid, self.module.params["timeout"])
        if not ok:
            self.module.fail_json(msg=explain(what, str(status)), upid=upid)


def main() -> None:
    spec = proxmox_auth_argument_spec()
    spec.update(
        node={"type": "str", "required": True},
        vmid={"type": "int", "required": True},
        state={"type": "str", "required": True, "choices": ["listed", "present", "pruned", "rollback"]},
        name={"type": "str", "default": ""},
        venv={"type": "str", "default": ""},
        keep={"type": "int", "default": 3},
        start={"type": "bool", "default": True},
        timeout={"type": "int", "default": 300},
    )
    module = AnsibleModule(
        argument_spec=spec,
        supports_check_mode=True,
        required_if=[("state", "rollback", ["name"])],
    )
    p = module.params
    if p["state"] == "rollback" and not VALID_NAME.match(p["name"]):
        module.fail_json(
            msg=f"{p['name']!r} is not a PVE snapshot name (a letter, then letters, digits, - or _; 40 at most)"
        )
    if p["state"] == "pruned" and p["keep"] < 1:
        module.fail_json(msg=f"keep must be 1 or more, not {p['keep']}")
    snaps = Snapshots(module)
    before = snaps.listed()
    changed, removed, extra = False, [], {}
    if p["state"] == "listed":
        pick = chosen(before, p["name"])
        extra = (
            {"chosen": pick, "unavailable": ""}
            if isinstance(pick, dict)
            else {"chosen": {}, "unavailable": pick}
        )
    elif p["state"] == "present":
        now = datetime.now(UTC)
        extra = {"name": snapshot_name(p["venv"], now)}
        if not any(s["name"] == extra["name"] for s in before):
            changed = True
            if not module.check_mode:
                what = f"snapshot CT {p['vmid']} as {extra['name']}"
                snaps.run_task(
                    what, snaps.api.post, snapname=extra["name"], description=description(p["venv"], now)
                )
    elif p["state"] == "pruned":
        removed = to_prune(before, p["keep"])
        changed = bool(removed)
        for name in [] if module.check_mode else removed:
            snaps.run_task(f"delete snapshot {name} of CT {p['vmid']}", snaps.api(name).delete)
    elif p["state"] == "rollback":
        if not any(s["name"] == p["name"] for s in before):
            module.fail_json(msg=f"CT {p['vmid']} has no snapshot {p['name']}.")
        changed = True
        if not module.check_mode:
            what = f"roll CT {p['vmid']} back to snapshot {p['name']}"
            snaps.run_task(what, snaps.api(p["name"]).rollback.post, start=int(p["start"]))
    after = before if module.check_mode or not changed else snaps.listed()
    module.exit_json(changed=changed, snapshots=after, ours=ours(after), removed=removed, **extra)


if __name__ == "__main__":
    main()
