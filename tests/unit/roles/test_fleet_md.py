"""fleet.md's stage cells, as the fleet_report role writes them from the doctor's report: a warn or a
fail carries its reason in a word or two (the diagnosis codes of the stage's probes with that status, or
their names where they have none); a pass, a skip and a container the doctor did not reach do not."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from localplay import run_play

PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: fleet_report
"""


def probe(name: str, stage: str, status: str, code: str | None = None) -> dict[str, Any]:
    return {"name": name, "stage": stage, "status": status, "summary": "", "evidence": {}, "code": code}


def report_for(tmp_path: Path, probes: list[dict[str, Any]]) -> subprocess.CompletedProcess[str]:
    """The role run on one container (n1-ct1) whose doctor report holds `probes`, and one (n1-ct2) the
    doctor did not reach."""
    hosts = {
        "n1-ct1": {
            "mlstack_pve_host": "n1",
            "proxmox_vmid": 1,
            "mlstack_container": {"profile": "p1"},
            "doctor_report": {"summary": {"ok": False, "root_cause": None}, "probes": probes},
        },
        "n1-ct2": {"mlstack_pve_host": "n1", "proxmox_vmid": 2, "mlstack_container": {"profile": "p1"}},
    }
    inventory = {"all": {"children": {"mlstack_containers": {"hosts": hosts}}}}
    (tmp_path / "inventory.yml").write_text(yaml.safe_dump(inventory))
    evars = {"fleet_report_dir": str(tmp_path / "reports")}
    return run_play(tmp_path, PLAYBOOK, evars, inventory=str(tmp_path / "inventory.yml"))


def cells(tmp_path: Path, container: str) -> dict[str, str]:
    """A container's stage cells in fleet.md, by the table's column names."""
    table = [ln for ln in (tmp_path / "reports" / "fleet.md").read_text().splitlines() if ln.startswith("| ")]
    head = [c.strip() for c in table[0].strip("|").split("|")]
    (line,) = [ln for ln in table if ln.startswith(f"| n1 | {container} |")]
    return dict(zip(head, (c.strip() for c in line.strip("|").split("|")), strict=True))


@pytest.mark.parametrize(
    ("probes", "expected"),
    [
        (
            [
                probe("device_nodes", "host", "pass"),
                probe("nvidia_driver", "host", "warn", "GPU_NODES_NO_DRIVER"),
                probe("c_compiler", "toolchain", "pass"),
                probe("triton_target", "triton", "fail", "TRITON_NO_C_COMPILER"),
            ],
            {
                "host": "warn (GPU_NODES_NO_DRIVER)",
                "toolchain": "pass",
                "triton": "fail (TRITON_NO_C_COMPILER)",
            },
        ),
        # A warn without a diagnosis code: the probe's name.
        ([probe("causal_conv1d", "packages", "warn")], {"packages": "warn (causal_conv1d)"}),
        # Only the probes of the stage's verdict give its reason: a warn beside a fail is not the reason.
        (
            [probe("a", "fla", "warn", "FLA_SLOW"), probe("b", "fla", "fail", "FLA_DEVICE_CPU")],
            {"fla": "fail (FLA_DEVICE_CPU)"},
        ),
        # Several probes of one verdict: each code once.
        (
            [
                probe("a", "host", "warn", "X_ONE"),
                probe("b", "host", "warn", "X_TWO"),
                probe("c", "host", "warn", "X_ONE"),
            ],
            {"host": "warn (X_ONE, X_TWO)"},
        ),
        ([probe("a", "host", "pass"), probe("b", "model", "skip")], {"host": "pass", "model": "skip"}),
    ],
)
def test_a_stage_cell_gives_the_reason_of_a_warn_or_fail(
    tmp_path: Path, probes: list[dict[str, Any]], expected: dict[str, str]
) -> None:
    proc = report_for(tmp_path, probes)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    found = cells(tmp_path, "n1-ct1")
    assert {stage: found[stage] for stage in expected} == expected
    assert {found[stage] for stage in expected} <= {c.strip() for c in proc.stdout.split("|")}, "printed too"
    unreached = cells(tmp_path, "n1-ct2")
    assert {unreached[stage] for stage in expected} == {"not reached"}
