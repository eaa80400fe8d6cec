#!/usr/bin/python
"""Documentation of the ct_plan action (plugins/action/ct_plan.py): it runs on the controller only."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ct_plan
short_description: Say which of create, configure and start a PVE container needs, from guests already read
description:
  - Runs on the controller only, from what C(community.proxmox.proxmox_vm_info) with C(config=current)
    returned - no API call, nothing on the node. Changes nothing.
  - A container that is not among O(guests) needs all three steps. One that is, needs configuring when its
    devN/mpN keys differ from O(options) (compared as mlstack.pve.pct_config compares them, extra managed
    keys counting as a difference), and starting when its status is not C(running).
options:
  guests:
    description: The guests read (C(proxmox_vms)), each with C(vmid), C(type), C(status) and C(config).
    type: list
    elements: dict
    required: true
  vmid:
    description: The container's ID.
    type: int
    required: true
  options:
    description: Its wanted devN and mpN keys, as mlstack.pve.pct_config takes them.
    type: dict
    required: true
author: mlstack maintainers
"""

EXAMPLES = r"""
- name: Compare container 120 with what the API read
  mlstack.pve.ct_plan:
    guests: "{{ _guests.proxmox_vms }}"
    vmid: 120
    options: {dev0: "/dev/nvidia0,gid=44,mode=0666"}
  register: _plan

- name: Start it only when it does not run
  mlstack.pve.pct_start:
    vmid: 120
  when: _plan.start
"""

RETURN = r"""
create:
  description: Whether the container does not exist yet.
  type: bool
  returned: always
configure:
  description: Whether its devN/mpN keys differ from O(options).
  type: bool
  returned: always
start:
  description: Whether it does not run.
  type: bool
  returned: always
set:
  description: Keys that differ or are missing.
  type: dict
  returned: always
deleted:
  description: Managed keys it has that O(options) does not.
  type: list
  returned: always
"""
