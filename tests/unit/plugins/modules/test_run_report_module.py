"""mlstack.pve.run_report for real (ansible-playbook on localhost): the command's output and its report
in one task, and the triton_warm role naming a missing doctor with its fix instead of an exec error."""

from __future__ import annotations

import subprocess
from pathlib import Path

from localplay import run_play

RUN = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Run the tool and read its report
      mlstack.pve.run_report:
        argv: ["{{ tool }}", "--output", "{{ out }}"]
        report: "{{ out }}"
      register: r
      changed_when: false
      failed_when: r.rc not in [0, 1] or r.report is none

    - name: Say what came back
      ansible.builtin.debug:
        msg: "rc={{ r.rc }} lines={{ r.stdout_lines | join('|') }} tier={{ r.report.tier }}"
"""
WARM = """
- hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: triton_warm
"""
# Prints a table line, writes a report to --output, exits $RC.
TOOL = """#!/bin/sh
echo "probe  pass"
printf '{"tier": "warm", "probes": []}' > "$2"
exit "${RC:-0}"
"""


def play(tmp_path: Path, text: str, evars: dict, rc: int = 0) -> subprocess.CompletedProcess:
    return run_play(tmp_path, text, evars, env={"RC": str(rc)})


def tool(tmp_path: Path) -> Path:
    path = tmp_path / "tool"
    path.write_text(TOOL)
    path.chmod(0o755)
    return path


def test_the_output_and_the_report_come_back_in_one_task(tmp_path: Path) -> None:
    evars = {"tool": str(tool(tmp_path)), "out": str(tmp_path / "report.json")}
    proc = play(tmp_path, RUN, evars, rc=1)
    assert proc.returncode == 0 and "rc=1 lines=probe  pass tier=warm" in proc.stdout, proc.stdout[-3000:]


def test_an_exit_code_of_2_fails_the_task(tmp_path: Path) -> None:
    evars = {"tool": str(tool(tmp_path)), "out": str(tmp_path / "report.json")}
    proc = play(tmp_path, RUN, evars, rc=2)
    assert proc.returncode == 2 and "not read: the command exited 2" in proc.stdout, proc.stdout[-3000:]


def test_triton_warm_names_a_missing_doctor_and_its_fix(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    evars = {
        "triton_warm_venv": str(venv),
        "triton_warm_report_path": str(tmp_path / "warm.json"),
        "triton_warm_expect_gpu": True,
    }
    proc = play(tmp_path, WARM, evars)
    said = " ".join(proc.stdout.split())
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert f"{venv}/bin/mlstack-doctor is missing: run the doctor role" in said, said[-3000:]
