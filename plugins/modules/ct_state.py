#!/usr/bin/python
"""Ansible module: read what a role manages inside a container in one round trip, and say what differs."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ct_state
short_description: Read a role's managed state in one round trip and say which items differ
description:
  - Runs inside the container (one C(pct exec) with pipelining). Reads every item given and returns what
    it found and, for each item that is not in the wanted state, why. Changes nothing.
  - A role reads its state with one call, then runs a mutating task only for an item that differs, so a
    rerun on an unchanged container costs one round trip per role instead of one per item.
  - Fails closed - an item that cannot be read differs.
options:
  items:
    description:
      - Items by key. C(type) is one of C(file) (C(path), optional C(sha1), C(mode), C(owner), C(group)),
        C(directory) (C(path), optional C(mode), C(owner), C(group)), C(link) (C(path), optional C(src)),
        C(packages) (C(names), installed per dpkg), C(version) (C(argv) prints C(expect), or C(expect)
        followed by a space and more), C(libcuda) (the version of the libcuda.so.1 the linker cache lists
        first, as its file names it; optional C(version) it must be), C(venv) (C(path), a venv the builder
        completed whose site-packages still hold what its manifest recorded), C(dist) (C(venv), C(name),
        optional C(version)), C(subdirs) (C(path); lists folders, never differs), C(free) (C(paths), each
        path with the bytes a step needs there; the bytes free and the filesystems that lack them, never
        differs) or C(dpkg_audit) (what C(dpkg --audit) lists as left half-done by an interrupted dpkg).
    type: dict
    required: true
author: mlstack maintainers
"""

EXAMPLES = r"""
- name: Read the toolchain's state
  mlstack.pve.ct_state:
    items:
      packages: {type: packages, names: [gcc, python3-dev]}
      apt_bounds: {type: file, path: /etc/apt/apt.conf.d/80mlstack-bounds, sha1: "0123...", mode: "0644"}
  register: _state

- name: Install the packages only when one is missing
  ansible.builtin.apt:
    name: [gcc, python3-dev]
  when: "'packages' in _state.differs"
"""

RETURN = r"""
found:
  description: What each item was found to be (a checksum, a link target, a version, missing names...).
  type: dict
  returned: always
differs:
  description: For each item not in the wanted state, why (missing, content differs, points at X...).
  type: dict
  returned: always
"""

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.mlstack.pve.plugins.module_utils.ct_state import read_state


def main() -> None:
    module = AnsibleModule(
        argument_spec={"items": {"type": "dict", "required": True}}, supports_check_mode=True
    )

    def run(argv: list[str]) -> tuple[int, str, str]:
        try:
            return module.run_command(argv, handle_exceptions=False)
        except OSError:  # the command itself is missing (a tool not installed yet)
            return 127, "", f"{argv[0]}: not found"

    module.exit_json(changed=False, **read_state(module.params["items"], run))


if __name__ == "__main__":
    main()
