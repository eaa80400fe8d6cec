"""mlstack.pve.worker_gc for real (ansible-playbook on localhost): with it enabled, the worker that runs a
task has frozen the heap it inherited (the objects the main process held at the fork), so its collections
leave them out; without it nothing is frozen. The checkout's ansible.cfg enables it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from localplay import ROOT, run_play

# A filter runs where the task is templated: in the forked worker.
FILTER = """
import gc


class FilterModule:
    def filters(self):
        return {"frozen_objects": lambda _: gc.get_freeze_count()}
"""

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: What the worker has frozen
      ansible.builtin.debug:
        msg: "frozen={{ 0 | frozen_objects }}"
"""


def frozen_in_worker(tmp_path: Path, callbacks: str | None) -> int:
    plugins = tmp_path / "filter_plugins"
    plugins.mkdir(exist_ok=True)
    (plugins / "frozen.py").write_text(FILTER)
    env = {"ANSIBLE_FILTER_PLUGINS": str(plugins)}
    if callbacks:
        env["ANSIBLE_CALLBACKS_ENABLED"] = callbacks
    proc = run_play(tmp_path, PLAYBOOK, {}, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    found = re.search(r"frozen=(\d+)", proc.stdout)
    assert found, proc.stdout[-3000:]
    return int(found.group(1))


def test_a_worker_freezes_what_it_inherits_only_with_the_callback(tmp_path: Path) -> None:
    # The main process holds tens of thousands of objects by the time it forks a worker.
    assert frozen_in_worker(tmp_path, "mlstack.pve.worker_gc") > 10_000
    assert frozen_in_worker(tmp_path, None) == 0


def test_the_checkouts_ansible_cfg_enables_it() -> None:
    env = dict(os.environ, ANSIBLE_CONFIG=str(ROOT / "ansible.cfg"))
    proc = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-config"), "dump", "--only-changed"],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("CALLBACKS_ENABLED"))
    assert "mlstack.pve.worker_gc" in line, line
