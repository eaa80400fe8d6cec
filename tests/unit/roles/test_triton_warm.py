"""The triton_warm role for real (ansible-playbook on localhost), with a stand-in doctor that writes a
report the real doctor produced on the H200: changed only when it warmed, the skip and its reason."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
H200 = ROOT / "verify" / "tests" / "data" / "h200"
PLAYBOOK = """
- hosts: localhost
  connection: local
  gather_facts: false
  roles:
    - role: triton_warm
"""
# mlstack-doctor stand-in: copies $REPORT to --output, records its argv, exits $RC.
DOCTOR = """#!/bin/sh
echo "$@" > "$(dirname "$0")/argv"
while [ $# -gt 0 ]; do [ "$1" = --output ] && cp "$REPORT" "$2"; shift; done
exit "$RC"
"""


def _play(tmp_path: Path, report: Path, rc: int, **extra: object) -> tuple[subprocess.CompletedProcess, str]:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    doctor = venv / "bin" / "mlstack-doctor"
    doctor.write_text(DOCTOR)
    doctor.chmod(0o755)
    (tmp_path / "play.yml").write_text(PLAYBOOK)
    (tmp_path / "out").mkdir(mode=0o755, exist_ok=True)  # the doctor role made it: only warming changes
    (tmp_path / "out").chmod(0o755)
    evars = {
        "triton_warm_venv": str(venv),
        "triton_warm_report_path": str(tmp_path / "out" / "warm.json"),
        "triton_warm_triton_cache_root": str(tmp_path / "cache"),
        "doctor_controller_report_dir": str(tmp_path / "reports"),
        "ansible_python_interpreter": sys.executable,
        **extra,
    }
    env = dict(
        os.environ,
        REPORT=str(report),
        RC=str(rc),
        ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".venv" / "collections"),  # mlstack.pve.run_report
        ANSIBLE_CONFIG=str(tmp_path / "none.cfg"),
        ANSIBLE_STDOUT_CALLBACK="default",
    )
    (tmp_path / "none.cfg").write_text("[defaults]\n")
    playbook = str(Path(sys.executable).parent / "ansible-playbook")
    argv = [playbook, "-i", "localhost,", str(tmp_path / "play.yml"), "-e", json.dumps(evars)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    return proc, (venv / "bin" / "argv").read_text() if (venv / "bin" / "argv").exists() else ""


@pytest.mark.parametrize(
    "report,expect_gpu,changed,says",
    [
        ("warm_tiny", True, 1, "warmed: 8 kernel configs tuned"),
        ("warm_tiny", True, 1, "WARNING [FLA_BACKWARD_NEEDS_TILELANG]"),
        ("warm_tiny_again", True, 0, "skipped: cache key already warm"),
    ],
)
def test_reports_and_changes_only_when_it_warmed(
    tmp_path: Path, report: str, expect_gpu: bool, changed: int, says: str
) -> None:
    proc, argv = _play(tmp_path, H200 / f"{report}.json", 0, triton_warm_expect_gpu=expect_gpu)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"changed={changed}" in proc.stdout and says in proc.stdout
    assert "--tier warm" in argv and "--seq-len 2048 --batch-size 1" in argv and "--no-gpu" not in argv
    assert f"--triton-cache-root {tmp_path / 'cache'}" in argv


def test_without_gpu_skips_with_its_reason_and_runs_nothing(tmp_path: Path) -> None:
    proc, argv = _play(
        tmp_path,
        H200 / "warm_tiny_again.json",
        0,
        triton_warm_expect_gpu=False,
        triton_warm_seq_lens=[2048, 4096],
    )
    assert proc.returncode == 0 and "changed=0" in proc.stdout, proc.stdout[-3000:]
    assert "skipped: no GPU expected (triton_warm_expect_gpu is false: nothing to warm)" in proc.stdout
    assert argv == ""  # the doctor was not started


def test_failed_warm_fails_the_host_with_the_fix(tmp_path: Path) -> None:
    doc = json.loads((H200 / "stress_tiny_cold_shared.json").read_text())  # a report with a root cause
    doc["probes"].append({"name": "triton_warm", "status": "skip", "summary": "skipped", "evidence": {}})
    (tmp_path / "bad.json").write_text(json.dumps(doc))
    proc, _ = _play(tmp_path, tmp_path / "bad.json", 1)
    assert proc.returncode != 0 and "[AUTOTUNER_RACE]. Fix:" in proc.stdout, proc.stdout[-3000:]
