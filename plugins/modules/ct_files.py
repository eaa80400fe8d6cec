#!/usr/bin/python
"""Ansible module: write the files and folders of a role's state that differ, in one round trip."""

from __future__ import annotations

DOCUMENTATION = r"""
module: ct_files
short_description: Write a role's files, folders and links in one round trip, each only where it differs
description:
  - Runs inside the container (one C(pct exec) with pipelining), the writing half of M(mlstack.pve.ct_state).
    A role reads its state with one call, then hands the items that differ to this module, so a new
    container gets its folders and files in one round trip instead of three per file.
  - A file is replaced atomically (a temporary file beside it, synced, renamed over it), and so is a
    symlink (a new link beside it, renamed over it); a folder is made with its parents. An item already
    as wanted is left alone. Supports check mode and diff mode.
options:
  items:
    description:
      - Items by key, in the shape M(mlstack.pve.ct_state) reads - C(type) C(file), C(directory) or C(link),
        C(path), optional C(mode) (octal text), C(owner) and C(group) (only C(root) is set; otherwise left as
        is); a C(link) item's C(src) is the target it must point at, as written. Any C(sha1) is ignored (the
        content decides). Folders are made first, then files and links in the order given.
      - A C(file) item's optional C(validate) is a command, with C(%s) for the new file, that must succeed
        before the file replaces what is there (as M(ansible.builtin.copy)'s C(validate)); its output is
        the failure's message.
    type: dict
    required: true
  contents:
    description: The text of each C(file) item, by the same key.
    type: dict
    default: {}
  sources:
    description:
      - A file on the controller for a C(file) item, by the same key, instead of a text in C(contents); it
        may be binary (a wheel). The action plugin reads each one whose item is given and sends it with
        the module's arguments, so the copy costs no extra round trip. The diff shows its size and sha1.
    type: dict
    default: {}
  contents_base64:
    description: The content of a C(file) item in base64, by key; the action plugin fills it from C(sources).
    type: dict
    default: {}
author: mlstack maintainers
"""

EXAMPLES = r"""
- name: Write the files that differ
  mlstack.pve.ct_files:
    items:
      bin_dir: {type: directory, path: /opt/tool/bin, mode: "0755", owner: root, group: root}
      script: {type: file, path: /opt/tool/bin/run, mode: "0755", owner: root, group: root}
    contents:
      script: "{{ lookup('ansible.builtin.template', 'run.sh.j2') }}"

- name: Copy a wheel and its folder
  mlstack.pve.ct_files:
    items:
      dist: {type: directory, path: /opt/tool/dist, mode: "0755", owner: root, group: root}
      wheel: {type: file, path: /opt/tool/dist/tool-1.0-py3-none-any.whl, mode: "0644", owner: root, group: root}
    sources:
      wheel: /build/dist/tool-1.0-py3-none-any.whl
"""

RETURN = r"""
changed_items:
  description: The keys of the items written (in check mode, those that would be).
  type: list
  elements: str
  returned: always
"""

import base64
import binascii
import shlex

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.mlstack.pve.plugins.module_utils.ct_files import apply_items


def main() -> None:
    module = AnsibleModule(
        argument_spec={
            "items": {"type": "dict", "required": True},
            "contents": {"type": "dict", "default": {}},
            # Read on the controller by the action plugin, which sends contents_base64 instead.
            "sources": {"type": "dict", "default": {}},
            "contents_base64": {"type": "dict", "default": {}},
        },
        supports_check_mode=True,
    )

    def validate(command: str, path: str) -> None:
        argv = [word.replace("%s", path) for word in shlex.split(command)]
        rc, out, err = module.run_command(argv)
        if rc != 0:
            raise ValueError(f"{' '.join(argv)} refused it (exit {rc}): {(err or out).strip()}")

    contents: dict[str, str | bytes] = dict(module.params["contents"])
    try:
        for key, encoded in module.params["contents_base64"].items():
            contents[key] = base64.b64decode(str(encoded), validate=True)
    except binascii.Error as e:
        module.fail_json(msg=f"contents_base64: not base64: {e}")
    try:
        changed, diffs = apply_items(module.params["items"], contents, module.check_mode, validate)
    except (OSError, ValueError) as e:
        module.fail_json(msg=f"cannot write the role's files: {e}")
    result = {"changed": bool(changed), "changed_items": changed}
    if module._diff:
        result["diff"] = diffs
    module.exit_json(**result)


if __name__ == "__main__":
    main()
