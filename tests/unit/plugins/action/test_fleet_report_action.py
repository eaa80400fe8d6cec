"""The fleet_report role for real (ansible-playbook on localhost, containers as inventory hosts that are
never reached): mlstack.pve.fleet_report writes fleet.json and fleet.md as the role always wrote them,
prints the same lines, compares with the previous report, and fails naming a driver userspace mismatch."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import yaml
from localplay import run_play

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: fleet_report
"""
REPORT = {
    "summary": {"ok": True, "root_cause": None},
    "probes": [
        {"name": "host", "stage": "host", "status": "pass", "evidence": {}},
        {"name": "torch", "stage": "torch", "status": "pass", "evidence": {"version": "2.11.0"}},
    ],
}
MISMATCH = {
    "node": "580.1",
    "libcuda": "575.2",
    "method": "runfile",
    "status": "mismatch",
    "summary": "libcuda 575.2 inside",
    "fix": "rerun provision.yml",
}
# fleet.md as the role's template renders it for HOSTS (no previous report; n1-ct1 mismatched).
FIRST_MD = """# Fleet report

| node | container | vmid | profile | extras | purpose | host | torch | root cause |
|---|---|---|---|---|---|---|---|---|
| n1 | n1-ct1 | 1 | p1 (inventory) | tilelang (inventory) | training | pass | pass |  |
| n2 | n2-ct2 | 2 | p2 (inventory) | none (inventory) | inference | not reached | not reached | \
did not reach the doctor |

## Driver userspace against the node's kernel module

| container | vmid | node | kernel module | libcuda inside | fix |
|---|---|---|---|---|---|
| n1-ct1 | 1 | n1 | 580.1 | 575.2 | rerun provision.yml |

## Since the last report

No previous report here: the next run shows what changed.
"""


def hosts(mismatch: bool) -> dict[str, Any]:
    return {
        "n1-ct1": {
            "mlstack_pve_host": "n1",
            "proxmox_vmid": 1,
            "mlstack_container": {"profile": "p1", "extras": ["tilelang"]},
            "doctor_report": REPORT,
            "nvidia_userspace_check": MISMATCH if mismatch else {**MISMATCH, "status": "match", "fix": None},
        },
        "n2-ct2": {
            "mlstack_pve_host": "n2",
            "proxmox_vmid": 2,
            "mlstack_container": {"profile": "p2", "purpose": "inference"},
        },
    }


def play(tmp_path: Path, mismatch: bool) -> subprocess.CompletedProcess:
    inventory = {"all": {"children": {"mlstack_containers": {"hosts": hosts(mismatch)}}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    evars = {"fleet_report_dir": str(tmp_path / "reports")}
    return run_play(
        tmp_path,
        PLAYBOOK,
        evars,
        inventory=str(tmp_path / "inventory.yml"),
        env={"ANSIBLE_STDOUT_CALLBACK": "default"},
    )


def test_the_report_is_written_printed_and_fails_naming_the_mismatch(tmp_path: Path) -> None:
    proc = play(tmp_path, mismatch=True)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert (tmp_path / "reports" / "fleet.md").read_text() == FIRST_MD
    said = " ".join(proc.stdout.split())
    for line in FIRST_MD.rstrip().splitlines():
        assert " ".join(line.split()) in said  # each line printed by "Show the fleet report"
    assert (
        "Driver userspace differs from the node's kernel module in 1 container(s): n1-ct1 (vmid 1, node n1)"
        in said
    )
    doc = json.loads((tmp_path / "reports" / "fleet.json").read_text())
    assert [r["container"] for r in doc["containers"]] == ["n1-ct1", "n2-ct2"]
    assert doc["drift"]["first"] is True and doc["generated"].endswith("Z")
    assert [m["container"] for m in doc["userspace_mismatches"]] == ["n1-ct1"]


def test_a_rerun_compares_with_the_previous_report_and_changes_nothing(tmp_path: Path) -> None:
    play(tmp_path, mismatch=True)
    first = json.loads((tmp_path / "reports" / "fleet.json").read_text())
    proc = play(tmp_path, mismatch=False)
    assert proc.returncode == 0 and "changed=0" in proc.stdout, proc.stdout[-3000:]
    doc = json.loads((tmp_path / "reports" / "fleet.json").read_text())
    assert doc["drift"]["since"] == first["generated"] and doc["drift"]["first"] is False
    assert doc["drift"]["containers"] == {
        "n1-ct1": [],
        "n2-ct2": ["not reached by the doctor: its stack and verdicts not compared"],
    }
    assert doc["userspace_mismatches"] == []
    md = (tmp_path / "reports" / "fleet.md").read_text()
    assert f"## Since the last report ({first['generated']})" in md
    assert "All 1 container(s) compared match their node's kernel module." in md
    assert "| n1-ct1 | no change |" in md
