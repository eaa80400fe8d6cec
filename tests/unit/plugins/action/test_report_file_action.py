"""mlstack.pve.report_file for real (ansible-playbook on localhost): the report written with its folder,
changed only when its content differs, left alone otherwise, nothing written in check mode."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from localplay import run_play

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Save the report
      mlstack.pve.report_file:
        content: "{{ report | to_nice_json }}\\n"
        dest: "{{ dest }}"
"""


def play(tmp_path: Path, report: dict, *flags: str) -> subprocess.CompletedProcess:
    return run_play(tmp_path, PLAYBOOK, {"report": report, "dest": str(tmp_path / "out" / "ct.json")}, *flags)


def test_written_once_then_left_alone_until_it_differs(tmp_path: Path) -> None:
    out = tmp_path / "out" / "ct.json"
    first = play(tmp_path, {"started": "t1"})
    assert first.returncode == 0 and "changed=1" in first.stdout, first.stdout[-3000:]
    assert json.loads(out.read_text()) == {"started": "t1"} and oct(out.stat().st_mode)[-3:] == "644"
    inode = out.stat().st_ino
    again = play(tmp_path, {"started": "t1"})
    assert again.returncode == 0 and "changed=0" in again.stdout, again.stdout[-3000:]
    assert out.stat().st_ino == inode
    new = play(tmp_path, {"started": "t2"})
    assert "changed=1" in new.stdout and json.loads(out.read_text()) == {"started": "t2"}


def test_check_mode_writes_nothing(tmp_path: Path) -> None:
    proc = play(tmp_path, {"started": "t1"}, "--check")
    assert proc.returncode == 0 and "changed=1" in proc.stdout, proc.stdout[-3000:]
    assert not (tmp_path / "out").exists()
