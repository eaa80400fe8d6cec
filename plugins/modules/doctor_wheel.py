#!/usr/bin/python
"""Documentation of the action plugin mlstack.pve.doctor_wheel (plugins/action/doctor_wheel.py): it runs on
the controller, in process; there is no module to run."""

from __future__ import annotations

DOCUMENTATION = r"""
module: doctor_wheel
short_description: Have the doctor's wheel on the controller, built only when its sources changed
description:
  - Runs on the controller, in process (an action plugin). First writes the shipped profiles and stack
    policy the doctor carries (C(src/mlstack_doctor/shipped_profiles.json), where it differs) from the
    collection's C(profiles/) beside O(src), so a changed profile or rule is a changed source.
  - Checks that O(uv) exists, builds the doctor's
    wheel from O(src) into O(dist_dir) with C(uv build --wheel) (fixed timestamps, so an unchanged doctor
    builds the same wheel) only where no wheel is there or the sources' checksum differs from the one kept
    beside it (C(mlstack_doctor.src-sha1)), then returns the newest wheel with its checksum and version.
  - A rerun with unchanged sources builds nothing and runs no command. Never reports a change (the wheel is
    the controller's build output, not managed state).
options:
  uv:
    description: uv on the controller.
    type: path
    required: true
  src:
    description: The doctor's source folder (pyproject.toml, src/), beside the collection's profiles/.
    type: path
    required: true
  dist_dir:
    description: Where the wheel is built and kept.
    type: path
    required: true
  python:
    description: The Python that runs Ansible, named in the message when uv is missing.
    type: path
author: mlstack maintainers
"""

EXAMPLES = r"""
- name: Have the doctor's wheel on the controller
  mlstack.pve.doctor_wheel:
    uv: "{{ ansible_playbook_python | dirname }}/uv"
    src: "{{ role_path }}/../../verify"
    dist_dir: "{{ playbook_dir }}/../build/dist"
  register: _wheel
  run_once: true
"""

RETURN = r"""
wheel:
  description: The wheel's path on the controller (the newest in O(dist_dir)).
  type: str
  returned: success
sha1:
  description: Its sha1.
  type: str
  returned: success
version:
  description: Its version, from its name.
  type: str
  returned: success
built:
  description: Whether this run built it.
  type: bool
  returned: success
sources_sha1:
  description: The checksum of the sources it was built from.
  type: str
  returned: success
"""
