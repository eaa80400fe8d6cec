"""The doctor is called one way (roles/doctor/tasks/run.yml, include_role tasks_from run) and its shared
values are defined once: a real play on localhost with a stand-in doctor runs the caller's tier with only
the caller's own arguments, saves and shows the report and fails naming every root cause; the settings the
role writes are what the doctor's own parser accepts; the roles' `purpose` choices are the doctor's."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from localplay import ROOT, run_play
from mlstack_doctor import engine, settings

ROLES = ROOT / "roles"
# mlstack-doctor stand-in: records its argv, copies $REPORT to --output, exits $RC.
DOCTOR = """#!/bin/sh
echo "$@" > "$(dirname "$0")/argv"
while [ $# -gt 0 ]; do [ "$1" = --output ] && cp "$REPORT" "$2"; shift; done
exit "$RC"
"""
RUN = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Run the doctor the one way
      ansible.builtin.include_role:
        name: doctor
        tasks_from: run
      vars:
        doctor_run_tier: "{{ tier }}"
        doctor_run_name: "{{ name }}"
        doctor_run_args: "{{ args }}"

    - name: Say what the play kept
      ansible.builtin.debug:
        msg: "kept={{ doctor_run_report.tier }} verdict={{ doctor_report.tier | default('none') }}"
"""
CAUSES = [
    {"probe": "package_versions", "code": "FLA_CORE_UNPAIRED", "fix": "pip install 'fla-core==0.6.0'"},
    {"probe": "nvidia_driver", "code": "NVML_UNAVAILABLE", "fix": "install the driver libraries"},
]


def spec(role: str) -> dict[str, Any]:
    return yaml.safe_load((ROLES / role / "meta" / "argument_specs.yml").read_text())["argument_specs"]


def play(
    tmp_path: Path, rc: int, report: dict[str, Any], playbook: str = RUN, **evars: Any
) -> tuple[Any, str]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    (venv / "bin" / "mlstack-doctor").write_text(DOCTOR)
    (venv / "bin" / "mlstack-doctor").chmod(0o755)
    (tmp_path / "report.json").write_text(json.dumps(report))
    values = {
        "doctor_venv": str(venv),
        "doctor_report_path": str(tmp_path / "out" / "report.json"),
        "doctor_controller_report_dir": str(tmp_path / "reports"),
        "name": "",
        "args": [],
        **evars,
    }
    (tmp_path / "out").mkdir(exist_ok=True)
    proc = run_play(tmp_path, playbook, values, env={"REPORT": str(tmp_path / "report.json"), "RC": str(rc)})
    argv = venv / "bin" / "argv"
    return proc, argv.read_text().strip() if argv.exists() else ""


def test_a_run_passes_only_the_tier_the_report_and_the_callers_arguments(tmp_path: Path) -> None:
    report = {"tier": "quick", "summary": {"ok": True, "root_cause": None, "root_causes": []}, "probes": []}
    proc, argv = play(tmp_path, 0, report, tier="quick", args=["--reuse-passed", "/r.json"])
    assert proc.returncode == 0, proc.stdout[-3000:]
    # The lock, model, purpose, GPUs and Triton cache are the container's doctor settings: none restated.
    assert argv == f"--tier quick --output {tmp_path}/out/report.json --reuse-passed /r.json"
    assert "kept=quick verdict=quick" in proc.stdout
    assert json.loads((tmp_path / "reports" / "localhost.json").read_text()) == report


def test_a_named_run_fails_with_every_root_cause_and_keeps_the_verdict_apart(tmp_path: Path) -> None:
    report = {"tier": "nccl", "summary": {"ok": False, "root_cause": CAUSES[0], "root_causes": CAUSES}}
    proc, argv = play(tmp_path, 1, report, tier="nccl", name="nccl")
    said = " ".join(proc.stdout.split())
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert argv.startswith("--tier nccl --output ")
    assert (
        "Doctor (nccl): package_versions failed [FLA_CORE_UNPAIRED]. Fix: pip install 'fla-core==0.6.0' || "
        "nvidia_driver failed [NVML_UNAVAILABLE]. Fix: install the driver libraries" in said
    ), said[-3000:]
    assert (tmp_path / "reports" / "localhost-nccl.json").is_file()
    assert not (tmp_path / "reports" / "localhost.json").exists()


def test_a_missing_doctor_is_named_with_its_fix(tmp_path: Path) -> None:
    evars = {
        "doctor_venv": str(tmp_path / "nowhere"),
        "doctor_report_path": str(tmp_path / "r.json"),
        "tier": "fast",
        "name": "",
        "args": [],
    }
    proc = run_play(tmp_path, RUN, evars)
    said = " ".join(proc.stdout.split())
    assert (
        proc.returncode == 2
        and f"{tmp_path}/nowhere/bin/mlstack-doctor is missing: run the doctor role" in said
    )


def test_the_settings_the_role_writes_are_what_the_doctor_reads(tmp_path: Path) -> None:
    text = """
- hosts: localhost
  connection: local
  gather_facts: false
  vars_files: [{defaults}, {vars}]
  tasks:
    - name: Write the settings as the role does
      ansible.builtin.copy:
        content: "{{{{ _doctor_settings_text }}}}\\n"
        dest: "{out}"
        mode: "0644"
""".format(
        defaults=ROLES / "doctor" / "defaults" / "main.yml",
        vars=ROLES / "doctor" / "vars" / "main.yml",
        out=tmp_path / "doctor.json",
    )
    proc = run_play(tmp_path, text, {"doctor_expect_gpu": "false", "doctor_model": "/models"})
    assert proc.returncode == 0, proc.stdout[-3000:]
    found = settings.parse((tmp_path / "doctor.json").read_text(), "doctor.json")
    assert (
        found.expect_gpu is False and found.model == "/models" and found.purpose == settings.DEFAULT_PURPOSE
    )
    assert (
        found.lock == "/opt/mlstack/venv/uv.lock" and found.triton_cache_root == "/var/cache/mlstack/triton"
    )
    role_vars = yaml.safe_load((ROLES / "doctor" / "vars" / "main.yml").read_text())
    assert role_vars["_doctor_settings_path"] == settings.PATH


def purpose_options(node: Any, where: str = "") -> list[tuple[str, dict[str, Any]]]:
    """Every option of an argument spec named purpose or *_purpose, however deep (suboptions too)."""
    found = []
    if isinstance(node, dict):
        for key, value in node.items():
            if isinstance(value, dict) and (key == "purpose" or key.endswith("_purpose")) and "type" in value:
                found.append((f"{where}{key}", value))
            found += purpose_options(value, f"{where}{key}.")
    return found


PURPOSE_OPTIONS = [
    (f"{r.name}:{k}", o) for r in sorted(ROLES.iterdir()) for k, o in purpose_options(spec(r.name))
]


def test_the_roles_that_take_a_purpose_are_found() -> None:
    names = {n.split(":")[1].split(".")[-1] for n, _ in PURPOSE_OPTIONS}
    assert {"doctor_purpose", "triton_warm_purpose", "doctor_monitor_purpose", "purpose"} <= names


@pytest.mark.parametrize("option", PURPOSE_OPTIONS, ids=lambda o: o[0])
def test_every_purpose_choice_is_the_doctors(option: tuple[str, dict[str, Any]]) -> None:
    _, opt = option
    assert opt["choices"] == list(settings.PURPOSES)
    assert opt.get("default", settings.DEFAULT_PURPOSE) == settings.DEFAULT_PURPOSE


def test_the_run_entry_point_offers_every_tier() -> None:
    assert spec("doctor")["run"]["options"]["doctor_run_tier"]["choices"] == list(engine.TIERS)


NCCL = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Decide on the NCCL tier as the role does after the full tier
      ansible.builtin.include_role:
        name: doctor
        tasks_from: nccl
"""


@pytest.mark.parametrize(
    ("nodes", "runs"),
    [
        (
            [
                "/dev/nvidia0",
                "/dev/nvidia1",
                "/dev/nvidiactl",
                "/dev/nvidia-uvm",
                "/dev/nvidia-caps/nvidia-cap1",
            ],
            True,
        ),
        (["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-caps/nvidia-cap1"], False),
    ],
    ids=["two GPUs", "one GPU"],
)
def test_auto_runs_the_nccl_tier_where_the_full_tiers_report_lists_several_gpu_nodes(
    tmp_path: Path, nodes: list[str], runs: bool
) -> None:
    # The GPU nodes come from the full tier's report (nvidia_device_nodes' evidence), not a search of /dev.
    full = {"probes": [{"name": "nvidia_device_nodes", "evidence": {"nodes": [{"path": p} for p in nodes]}}]}
    report = {"tier": "nccl", "summary": {"ok": True, "root_cause": None, "root_causes": []}, "probes": []}
    proc, argv = play(
        tmp_path,
        0,
        report,
        playbook=NCCL,
        doctor_nccl_report_path=str(tmp_path / "out" / "nccl.json"),
        doctor_nccl="auto",
        doctor_expect_gpu=True,
        doctor_report=full,
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert argv.startswith("--tier nccl ") is runs, proc.stdout[-3000:]
