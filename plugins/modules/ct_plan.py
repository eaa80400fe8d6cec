#!/usr/bin/python
"""Documentation of the ct_plan action (plugins/action/ct_plan.py): it runs on the controller only."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ct_plan
short_description: Say which steps a PVE container needs and what would change in it, from guests already read
description:
  - Runs on the controller only, from what M(mlstack.pve.pve_guests) returned (C(proxmox_vms) with their current
    configs, and C(pending)) - no API call, nothing on the node. Changes nothing.
  - A container that is not among O(guests) needs every step. One that is needs configuring when its devN/mpN
    keys differ from O(options) (extra managed keys counting as a difference), or a setting its inventory
    entry or its node states differs (the rows of module_utils/ct_table.py with a PVE key; a property list or
    tags only on what they name), or its disk is smaller than
    C(disk_gb); starting when its status is not C(running); restarting when a change waits for its next
    start and O(allow_restart) is true. A key the entry leaves out is never compared.
  - A root disk larger than C(disk_gb) is never shrunk; RV(refused) says so, with both sizes.
options:
  guests:
    description: The guests read (C(proxmox_vms)), each with C(vmid), C(type), C(status) and C(config).
    type: list
    elements: dict
    required: true
  pending:
    description: The running ones among those guests with PVE's pending changes applied; empty where none runs.
    type: list
    elements: dict
    default: []
  vmid:
    description: The container's ID.
    type: int
    required: true
  options:
    description: Its wanted devN and mpN keys, as mlstack.pve.pct_config takes them.
    type: dict
    required: true
  entry:
    description: Its inventory entry (the settings of module_utils/ct_table.py).
    type: dict
    default: {}
  node:
    description:
      - The node's settings, C(name), C(tag), C(bridge) and C(features). Without them only devN/mpN are compared.
    type: dict
    default: {}
  profile:
    description: The container's stack profile, named in a new container's description and the plan.
    type: str
    default: ""
  allow_restart:
    description: Whether a running container may be restarted for the changes PVE applies at its next start.
    type: bool
    default: false
author: mlstack maintainers
"""

EXAMPLES = r"""
- name: Compare container 120 with what the API read
  mlstack.pve.ct_plan:
    guests: "{{ _guests.proxmox_vms }}"
    pending: "{{ _guests.pending }}"
    vmid: 120
    options: {dev0: "/dev/nvidia0,gid=44,mode=0666"}
    entry: {vmid: 120, hostname: ml-120, cores: 4, memory_mb: 8192}
    node: {name: pve1, tag: mlstack, bridge: vmbr0, features: [nesting=1]}
  register: _plan

- name: Say what would change
  ansible.builtin.debug:
    msg: "{{ _plan.summary }}"
"""

RETURN = r"""
create:
  description: Whether the container does not exist yet.
  type: bool
  returned: always
configure:
  description: Whether its settings, devN/mpN keys or disk differ from what the inventory states.
  type: bool
  returned: always
start:
  description: Whether it does not run.
  type: bool
  returned: always
restart:
  description: Whether it runs, a change waits for its next start and O(allow_restart) is true.
  type: bool
  returned: always
needed:
  description: Whether any of RV(create), RV(configure), RV(start) and RV(restart) is; a container that needs none is only connected to.
  type: bool
  returned: always
set:
  description: Keys that differ or are missing, with the values to set.
  type: dict
  returned: always
deleted:
  description: Managed keys it has that O(options) does not.
  type: list
  returned: always
resize:
  description: The size its root disk would be grown to (C(24G)), or empty.
  type: str
  returned: always
changes:
  description: Each change by the inventory's name (C(memory_mb)), with C(old), C(new) and C(applies) (C(live) or C(at the next start)).
  type: dict
  returned: always
restart_needed:
  description: Names of the changes that wait for its next start, including those an earlier run left pending.
  type: list
  returned: always
refused:
  description: Why the inventory asks what PVE cannot do (a smaller disk, a value PVE refuses); empty when nothing.
  type: str
  returned: always
stated:
  description: The settings the inventory states, by PVE key, as mlstack.pve.pct_config takes them.
  type: dict
  returned: always
create_args:
  description: What a new container is created with (the entry, else the create's defaults).
  type: dict
  returned: when O(node) is given
summary:
  description: The plan in lines, one per change (C(CT 200 on pve1 - memory_mb 2048 -> 3072 (live))).
  type: list
  elements: str
  returned: always
"""
