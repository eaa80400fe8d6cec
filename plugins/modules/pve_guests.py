#!/usr/bin/python
"""Ansible module: the cluster's guests in one read, with the configs of those the inventory names or the
project's tag marks, and the pending changes of those that run."""

from __future__ import annotations

DOCUMENTATION = r"""
module: pve_guests
short_description: Read the cluster's guests, and the configs this project needs, in one module run
description:
  - Talks to the PVE API with community.proxmox's connection options (a token or a password), on the
    controller. One login, one C(/cluster/resources) listing of every guest, and then only what this
    project acts on; the rest of the cluster costs no call per guest.
  - Each guest is listed as C(community.proxmox.proxmox_vm_info) lists it (C(vmid), C(type), C(node),
    C(name), C(status), C(tags), C(template)). A container is read further where the project's tag
    O(tag) marks it or O(vmids) names its vmid. Its status is its node's live one (C(/cluster/resources)
    lags a start or a stop by seconds on PVE), and it has C(config) as PVE holds it now
    (C(config?current=1)).
  - Where such a container runs and O(pending) is true, RV(pending) has its config with PVE's
    pending changes applied (C(config?current=0)), which is what its next start runs with. A stopped
    container has none, as PVE applies a change to it at once.
  - A container removed between the listing and its config read is left out, as the listing had not
    named it. Any other refused call fails the module with the client's words, which
    C(mlstack.pve.pve_api_error) classifies.
  - Reads only; check mode reads too.
options:
  node:
    description: Only the guests of this node (the whole cluster when empty); a node the cluster lacks fails.
    type: str
    default: ""
  tag:
    description: The tag marking the containers this project owns (RV(ours)).
    type: str
    required: true
  vmids:
    description: The inventory's vmids; a container there is read with its config whatever its tags.
    type: list
    elements: int
    default: []
  pending:
    description: Also read the pending changes of the running containers read with their config.
    type: bool
    default: false
extends_documentation_fragment:
  - community.proxmox.proxmox.actiongroup_proxmox
  - community.proxmox.proxmox.documentation
author: mlstack maintainers
"""

EXAMPLES = r"""
- name: Read the guests, with the configs and pending changes of ours
  mlstack.pve.pve_guests:
    api_host: pve1.example.com
    api_user: root@pam
    api_token_id: mlstack
    api_token_secret: "{{ vault_token_secret }}"
    tag: mlstack
    vmids: [120, 121]
    pending: true
  register: _guests
  delegate_to: localhost
"""

RETURN = r"""
proxmox_vms:
  description: Every guest listed (of O(node), when set), by vmid; the containers read further have C(config).
  type: list
  elements: dict
  returned: always
pending:
  description: The running containers read further, each with C(config) holding PVE's pending changes applied.
  type: list
  elements: dict
  returned: always
ours:
  description: The vmids of the containers that carry O(tag).
  type: list
  elements: int
  returned: always
"""

from typing import Any

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.community.proxmox.plugins.module_utils.proxmox import (
    ProxmoxAnsible,
    proxmox_auth_argument_spec,
)
from ansible_collections.mlstack.pve.plugins.module_utils.ct_settings import split_tags

# PVE's answer for a guest whose config is gone (removed after the listing named it).
GONE = "does not exist"


def listed(guest: dict[str, Any]) -> dict[str, Any]:
    """A guest of /cluster/resources as proxmox_vm_info lists it: vmid an int, template a bool."""
    return {**guest, "vmid": int(guest["vmid"]), "template": bool(int(guest.get("template") or 0))}


def carries(guest: dict[str, Any], tag: str) -> bool:
    """A container with `tag`: in its config where it was read, else in the listing (which PVE fills from
    the same config)."""
    tags = (guest.get("config") or guest).get("tags") or ""
    return guest.get("type") == "lxc" and tag in split_tags(str(tags))


class Guests(ProxmoxAnsible):
    """The reads, each refusal failing the module with what was being read and the client's words."""

    def call(self, what: str, fn: Any, *args: Any, gone_is_none: bool = False, **kwargs: Any) -> Any:
        """fn's answer; with gone_is_none, None where PVE says the guest no longer exists."""
        try:
            return fn(*args, **kwargs)
        except Exception as e:  # proxmoxer's ResourceException or requests' errors
            if gone_is_none and GONE in str(e):
                return None
            self.module.fail_json(msg=f"Failed to retrieve {what}: {e}")

    def config(self, guest: dict[str, Any], current: int) -> dict[str, Any] | None:
        """The container's config (None where it is gone since the listing)."""
        what = (
            f"the {'config' if current else 'pending changes'} of CT {guest['vmid']} on node {guest['node']}"
        )
        api = self.proxmox_api.nodes(guest["node"]).lxc(guest["vmid"]).config
        return self.call(what, api.get, current=current, gone_is_none=True)


def main() -> None:
    spec = proxmox_auth_argument_spec()
    spec.update(
        node={"type": "str", "default": ""},
        tag={"type": "str", "required": True},
        vmids={"type": "list", "elements": "int", "default": []},
        pending={"type": "bool", "default": False},
    )
    module = AnsibleModule(
        argument_spec=spec,
        required_together=[("api_token_id", "api_token_secret")],
        required_one_of=[("api_password", "api_token_id")],
        supports_check_mode=True,
    )
    p = module.params
    api = Guests(module)
    if p["node"] and api.get_node(p["node"]) is None:
        module.fail_json(msg=f"Node {p['node']} doesn't exist in PVE cluster")
    resources = api.call(
        "VMs information from cluster resources", api.proxmox_api.cluster().resources().get, type="vm"
    )
    guests = {g["vmid"]: g for g in map(listed, resources) if not p["node"] or g.get("node") == p["node"]}
    wanted = set(p["vmids"])
    read = [
        g for g in guests.values() if g.get("type") == "lxc" and (g["vmid"] in wanted or carries(g, p["tag"]))
    ]
    # Each node's own list: live status and the fields PVE's node view adds.
    by_vmid = {g["vmid"]: g for g in read}
    for node in sorted({g["node"] for g in read}):
        live = api.call(f"LXC VMs information of node {node}", api.proxmox_api.nodes(node).lxc.get)
        for ct in live:
            guest = by_vmid.get(int(ct["vmid"]))
            if guest is not None:
                guest.update(listed({**guest, **ct}))
    pending = []
    for guest in read:
        config = api.config(guest, 1)
        if config is None:
            del guests[guest["vmid"]]
            continue
        guest["config"] = config
        if p["pending"] and guest.get("status") == "running":
            view = api.config(guest, 0)
            if view is not None:
                pending.append({**guest, "config": view})
    module.exit_json(
        changed=False,
        proxmox_vms=[guests[v] for v in sorted(guests)],
        pending=sorted(pending, key=lambda g: g["vmid"]),
        ours=sorted(v for v, g in guests.items() if carries(g, p["tag"])),
    )


if __name__ == "__main__":
    main()
