#!/usr/bin/python
"""Documentation of the inventory_check action (plugins/action/inventory_check.py): it runs on the
controller only."""

from __future__ import annotations

DOCUMENTATION = r"""
module: inventory_check
short_description: Check the container inventory before any change, failing with every message that applies
description:
  - Runs on the controller; changes nothing. The playbooks call it first, before any role, on the containers'
    entries (V(entries)); the gpu_container preflight then calls it once per group of checks, as what a group
    needs becomes known - the inventory's values, then the chosen stacks against the profiles, the node's GPUs
    and resolved paths, then the guests the PVE API listed.
  - V(entries) gives one line per mistake, naming the entry - a key that is no setting (with the closest
    one), a value a setting does not take, a GPU listed twice or one the node lacks, a vmid or hostname given
    twice in the inventory. The settings are the rows of module_utils/ct_table.py. When it finds mistakes, an
    entry lists GPU indices and O(gpu_nodes) is not given, it reads the node's device nodes
    (M(mlstack.pve.node_state) on the task's host) so that every mistake is listed at once.
  - Runs the checks O(checks) names, in that order; a named check without the options it needs fails the
    task, naming them. The task fails when any check finds something wrong; RV(errors) and the message list
    what to fix, one line each.
options:
  checks:
    description:
      - The checks to run. V(entries) needs O(containers) (and takes O(inventory) and O(gpu_nodes));
        V(node_settings) and V(token_settings) need O(settings); V(container_fields) O(containers); V(profiles_exist) O(profiles_dir); V(resources) O(choices) and O(profiles_dir);
        V(locks) O(locks); V(gpu_selections) O(gpu_nodes); V(unique) O(inventory); V(bind_sources)
        O(resolved) and O(mount_roots) (and O(caches)); V(foreign_vmids) O(guests) and O(ours);
        V(missing_passthrough) O(missing_nodes).
    type: list
    elements: str
    required: true
    choices: [node_settings, token_settings, container_fields, profiles_exist, resources, locks, gpu_selections,
              unique, bind_sources, foreign_vmids, missing_passthrough, entries]
  settings:
    description:
      - C(node), C(storage), C(bridge), C(ostemplate), C(tag) (PVE's formats), and C(token_id) with
        C(token_secret_set) (whether a secret is given; never the secret).
    type: dict
  containers:
    description: The node's containers as the inventory lists them (V(entries) takes any shape and names what is wrong).
    type: raw
  profiles_dir:
    description: The stack profiles' folder on the controller; a named profile must be one of its folders (profile.yml, pyproject.toml, uv.lock).
    type: path
  choices:
    description: Each container's stack choice by vmid; memory_mb and disk_gb against its profile.yml.
    type: dict
  locks:
    description: C(uv lock --check) results by profile (C(rc), C(stderr), C(msg); skipped ones pass).
    type: dict
  uv:
    description:
      - uv on the controller. Given (and O(locks) not), the V(locks) check runs C(uv lock --check) itself, in
        process, for each profile O(choices) names; empty, it checks none.
    type: path
  gpu_nodes:
    description: The node's NVIDIA device nodes; each container's C(gpus) must select among them.
    type: list
    elements: str
  inventory:
    description: "Every node's containers by node (C(node: [entries])); vmids and hostnames must be unique among them."
    type: dict
  resolved:
    description: Paths resolved on the node, each C(real) and C(exists) (mlstack.pve.node_state's C(paths)).
    type: dict
  mount_roots:
    description: Folders bind-mount sources must lie in (model paths must also exist).
    type: list
    elements: str
  caches:
    description: The shared caches, also checked against O(mount_roots).
    type: list
    elements: str
  guests:
    description: The guests the API listed; an inventory vmid must not be a guest of someone else's.
    type: list
    elements: dict
  ours:
    description: vmids of the guests that carry O(tag).
    type: list
    elements: int
  tag:
    description: The tag marking this project's containers.
    type: str
    default: mlstack
  missing_nodes:
    description: Passed-through device nodes the node lacks (mlstack.pve.missing_passthrough).
    type: list
    elements: dict
author: mlstack maintainers
"""

EXAMPLES = r"""
- name: Check the container entries before any role runs
  mlstack.pve.inventory_check:
    checks: [entries]
    containers: "{{ mlstack_containers | default([]) }}"
    inventory: "{{ dict(groups['pve_hosts'] | zip(groups['pve_hosts'] | map('extract', hostvars, 'mlstack_containers'))) }}"

- name: Check the inventory's settings and containers
  mlstack.pve.inventory_check:
    checks: [node_settings, token_settings, container_fields, profiles_exist]
    settings: {node: pve1, storage: local-lvm, bridge: vmbr0, ostemplate: "local:vztmpl/debian.tar.zst", tag: mlstack}
    containers: "{{ gpu_container_list }}"
    profiles_dir: "{{ playbook_dir }}/../profiles"
"""

RETURN = r"""
errors:
  description: What is wrong, one message each, with what to fix; empty when all is well.
  type: list
  elements: str
  returned: always
"""
