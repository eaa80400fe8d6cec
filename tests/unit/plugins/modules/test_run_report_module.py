"""mlstack.pve.run_report for real (ansible-playbook on localhost): the command's output and its report
in one task, run only where the items it reads first are as wanted (a plan only reads them), and the
triton_warm role naming a missing doctor with its fix instead of an exec error."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
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
# The same run, only where the tool's settings file is the one wanted (as the doctor role checks its install).
CHECKED = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Read the tool's settings, and run it where they are as wanted
      mlstack.pve.run_report:
        argv: ["{{ tool }}", "--output", "{{ out }}"]
        report: "{{ out }}"
        unless_differs:
          settings: {type: file, path: "{{ settings }}", sha1: "{{ 'wanted' | hash('sha1') }}"}
      register: r
      changed_when: false

    - name: Say what came back
      ansible.builtin.debug:
        msg: >-
          ran={{ r.ran }} differs={{ r.differs }} rc={{ r.rc | default('none') }}
          tier={{ r.report.tier | default('none') }}
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


@pytest.mark.parametrize(
    ("content", "flags", "said"),
    [
        ("wanted", (), "ran=True differs={} rc=0 tier=warm"),
        ("edited", (), "ran=False differs={'settings': 'content differs'} rc=none tier=none"),
        ("wanted", ("--check",), "ran=False differs={} rc=none tier=none"),
    ],
    ids=["as wanted: runs", "differs: nothing runs", "check mode: nothing runs"],
)
def test_the_command_runs_only_where_the_items_read_first_are_as_wanted(
    tmp_path: Path, content: str, flags: tuple[str, ...], said: str
) -> None:
    settings = tmp_path / "settings"
    settings.write_text(content)
    out = tmp_path / "report.json"
    evars = {"tool": str(tool(tmp_path)), "out": str(out), "settings": str(settings)}
    proc = run_play(tmp_path, CHECKED, evars, *flags)
    assert proc.returncode == 0 and said in proc.stdout, proc.stdout[-3000:]
    assert out.exists() == said.startswith("ran=True")


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
