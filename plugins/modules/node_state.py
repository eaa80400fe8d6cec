#!/usr/bin/python
"""Ansible module: read a PVE node's state for the pve_host role in one round trip."""

from __future__ import annotations

DOCUMENTATION = r"""
module: node_state
short_description: Read a PVE node's version, NVIDIA driver, devices, GPUs, template, directories and mounts at once
description:
  - Runs on the PVE node (one task, pipelined). Reads what O(gather) names, the templates on
    O(ostemplate)'s storage, which of O(directories) are not as wanted, where O(paths) really lead, and
    which bind mounts (mpN) of the running O(containers) no longer hold the node's folder. Changes nothing.
  - The pve_host role reads its node with one call, then runs a changing task (a download, a mkdir,
    nvidia-modprobe) only for what differs, so a rerun on an unchanged node costs one round trip.
  - A running container keeps the folder it bound at its start, so a shared folder removed or replaced on the
    node since then (the uv store, the Triton cache, models) stays the old one inside until the container
    starts again. Each mpN with a node path is compared, through the container's init process
    (C(lxc-info -n VMID -p -H), C(/proc/PID/mountinfo) and C(/proc/PID/root)), with the node's folder of
    that path; a mount of a deleted folder, or a device and inode other than the node's folder's, is
    listed in RV(stale_mounts). The config is the container's current one (C(/etc/pve/lxc/VMID.conf), else
    C(pct config VMID --current)). Stopped containers are not listed, since their next start binds the node's
    folders.
  - Fails when C(pveversion) or C(pveam list) fails. nvidia-smi failing or missing is no failure - the
    GPU list is then empty and RV(gpus_reason) says why.
options:
  gather:
    description: What to read besides the template, directories and paths.
    type: list
    elements: str
    choices: [pve_version, driver, devices, gpus]
    default: [pve_version, driver, devices, gpus]
  ostemplate:
    description: A template volid (storage:vztmpl/file); C(pveam list) of its storage says whether it is there.
    type: str
    default: ""
  directories:
    description: Directories as wanted, each C(path) with optional C(owner), C(group) (names or ids) and C(mode).
    type: list
    elements: dict
    default: []
  paths:
    description: Paths to resolve on the node (symlinks and C(..) followed).
    type: list
    elements: str
    default: []
  containers:
    description: vmids of containers on this node whose bind mounts to check; entries that are not vmids are left out.
    type: list
    elements: raw
    default: []
author: mlstack maintainers
"""

EXAMPLES = r"""
- name: Read the node's state
  mlstack.pve.node_state:
    ostemplate: local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst
    directories:
      - {path: /var/lib/mlstack/cache/uv, owner: 100000, group: 100000, mode: "0755"}
    paths: [/srv/models/llama]
    containers: [120, 121]
  register: _state

- name: Create the directory only when it differs
  ansible.builtin.file:
    path: /var/lib/mlstack/cache/uv
    state: directory
  when: "'/var/lib/mlstack/cache/uv' in _state.directories"
"""

RETURN = r"""
pve_version:
  description: pve-manager's version (C(pveversion)).
  type: str
  returned: when gathered
driver_version:
  description: The loaded NVIDIA kernel module's version; empty when none is loaded.
  type: str
  returned: when gathered
gpu_nodes:
  description: /dev/nvidia* and /dev/nvidia-caps/nvidia* paths, sorted.
  type: list
  returned: when gathered
gpus:
  description: The GPUs nvidia-smi lists, each C(index), C(name), C(uuid), C(compute_cap); [] when it cannot.
  type: list
  returned: when gathered
gpus_reason:
  description: Why RV(gpus) is empty (nvidia-smi missing or failing); empty otherwise.
  type: str
  returned: when gathered
templates:
  description: The volids on O(ostemplate)'s storage.
  type: list
  returned: when O(ostemplate) is given
template_present:
  description: Whether O(ostemplate) is among them.
  type: bool
  returned: when O(ostemplate) is given
directories:
  description: For each of O(directories) that is not as wanted, why (missing, owned by, mode).
  type: dict
  returned: always
paths:
  description: For each of O(paths), C(real) (the resolved path) and C(exists).
  type: dict
  returned: always
stale_mounts:
  description:
    - Each bind mount of a running container of O(containers) that no longer holds the node's folder, as
      C(vmid), C(folder) (the node path its mpN names), C(mount_point) (in the container), C(why) and
      C(summary) (one line naming all three).
  type: list
  elements: dict
  returned: when O(containers) is given
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.mlstack.pve.plugins.module_utils.node_state import GATHER, read_node


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "gather": {"type": "list", "elements": "str", "choices": list(GATHER), "default": list(GATHER)},
            "ostemplate": {"type": "str", "default": ""},
            "directories": {"type": "list", "elements": "dict", "default": []},
            "paths": {"type": "list", "elements": "str", "default": []},
            "containers": {"type": "list", "elements": "raw", "default": []},
        },
        supports_check_mode=True,
    )

    def run(argv: list[str]) -> tuple[int, str, str]:
        try:
            return module.run_command(argv, handle_exceptions=False)
        except OSError:  # the command itself is missing (nvidia-smi without a driver package)
            return 127, "", f"{argv[0]}: not found"

    try:
        state = read_node(
            run,
            module.params["gather"],
            module.params["ostemplate"],
            module.params["directories"],
            module.params["paths"],
            [int(v) for v in module.params["containers"] if str(v).isdigit()],
        )
    except ValueError as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=False, **state)


if __name__ == "__main__":
    main()
