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
# mlstack-doctor stand-in: copies $REPORT (under --warm-plan: $PLAN_REPORT, when set) to --output, appends
# its argv to argv (one line per run), exits $RC.
DOCTOR = """#!/bin/sh
echo "$@" >> "$(dirname "$0")/argv"
report="$REPORT"
for a in "$@"; do [ "$a" = --warm-plan ] && [ -n "$PLAN_REPORT" ] && report="$PLAN_REPORT"; done
while [ $# -gt 0 ]; do [ "$1" = --output ] && cp "$report" "$2"; shift; done
exit "$RC"
"""


def _play(
    tmp_path: Path,
    report: Path,
    rc: int,
    plan: Path | None = None,
    flags: tuple[str, ...] = (),
    **extra: object,
) -> tuple[subprocess.CompletedProcess, str]:
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
        PLAN_REPORT=str(plan or ""),
        RC=str(rc),
        ANSIBLE_ROLES_PATH=str(ROOT / "roles"),
        ANSIBLE_COLLECTIONS_PATH=str(ROOT / ".venv" / "collections"),  # mlstack.pve.run_report
        ANSIBLE_CONFIG=str(tmp_path / "none.cfg"),
        ANSIBLE_STDOUT_CALLBACK="default",
    )
    (tmp_path / "none.cfg").write_text("[defaults]\n")
    playbook = str(Path(sys.executable).parent / "ansible-playbook")
    argv = [playbook, "-i", "localhost,", str(tmp_path / "play.yml"), "-e", json.dumps(evars), *flags]
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


# The cluster's cache: a cold key is planned first, then installed from the controller's folder or warmed
# (and published) by the first container of the key. Reports are the H200's, their verdict rewritten.
KEY = "23199e4c265c6b7db892"


def _verdict(tmp_path: Path, name: str, action: str, **evidence: object) -> Path:
    """The H200's warm report with the triton_warm verdict rewritten to `action` and `evidence`."""
    doc = json.loads(
        (H200 / ("warm_tiny.json" if action == "warmed" else "warm_tiny_again.json")).read_text()
    )
    probe = next(p for p in doc["probes"] if p["name"] == "triton_warm")
    probe["evidence"].update(action=action, share_dir=str(tmp_path / "stage"), **evidence)
    if action == "installed":
        probe["summary"] = (
            f"skipped: installed from the cluster's cache {tmp_path / 'stage'}/{KEY}.tar.gz, key {KEY}"
        )
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(doc))
    return path


def _artifact(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{KEY}.tar.gz").write_bytes(b"tarball")
    (folder / f"{KEY}.json").write_text(json.dumps({"key": KEY}))


def test_a_key_the_controller_holds_is_brought_in_and_installed(tmp_path: Path) -> None:
    share = tmp_path / "share"
    _artifact(share)
    plan = _verdict(tmp_path, "plan", "planned", reason="no warm stamp in this cache (cold)")
    done = _verdict(tmp_path, "done", "installed", share_artifact=str(tmp_path / "stage" / f"{KEY}.tar.gz"))
    proc, argv = _play(tmp_path, done, 0, plan=plan, triton_warm_share_dir=str(share))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"skipped: installed from the cluster's cache {share}/{KEY}.tar.gz, key {KEY}" in proc.stdout
    assert (tmp_path / "stage" / f"{KEY}.tar.gz").read_bytes() == b"tarball"
    first, second = argv.splitlines()  # the plan, then the install: no run warmed
    assert "--warm-share= --warm-plan" in first and "--warm-share=" in second and "--warm-plan" not in second


def test_the_first_container_of_a_cold_key_warms_and_publishes_it(tmp_path: Path) -> None:
    share, stage = tmp_path / "share", tmp_path / "stage"
    _artifact(stage)  # what the doctor published into the node's share folder after its warm
    plan = _verdict(
        tmp_path, "plan", "planned", share_note=f"the cluster's cache {stage} holds no warmed key"
    )
    warmed = _verdict(tmp_path, "warmed", "warmed", share_artifact=str(stage / f"{KEY}.tar.gz"))
    proc, argv = _play(tmp_path, warmed, 0, plan=plan, triton_warm_share_dir=str(share))
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"Published to the cluster's cache {share}/{KEY}.tar.gz" in proc.stdout
    assert (share / f"{KEY}.tar.gz").read_bytes() == b"tarball" and (share / f"{KEY}.json").is_file()
    assert len(argv.splitlines()) == 2  # the plan, then the warm: nothing installed


def test_a_key_warm_here_that_the_controller_lacks_is_published_once(tmp_path: Path) -> None:
    share, stage = tmp_path / "share", tmp_path / "stage"
    _artifact(stage)
    warm = _verdict(tmp_path, "warm", "skipped", share_artifact=str(stage / f"{KEY}.tar.gz"))
    first, _ = _play(tmp_path, warm, 0, plan=warm, triton_warm_share_dir=str(share))
    assert first.returncode == 0 and "changed=1" in first.stdout, first.stdout[-3000:]
    assert (share / f"{KEY}.json").is_file()
    again, _ = _play(tmp_path, warm, 0, plan=warm, triton_warm_share_dir=str(share))
    assert "changed=0" in again.stdout and "Publish the key's cache" not in again.stdout, again.stdout[-3000:]


def test_on_shared_storage_nothing_goes_through_the_controller(tmp_path: Path) -> None:
    plan = _verdict(tmp_path, "plan", "planned")
    done = _verdict(tmp_path, "done", "installed", share_artifact=f"/mnt/warm/{KEY}.tar.gz")
    proc, argv = _play(
        tmp_path,
        done,
        0,
        plan=plan,
        triton_warm_share_dir=str(tmp_path / "share"),
        triton_warm_share_storage="/mnt/warm",
    )
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"installed from the cluster's cache /mnt/warm/{KEY}.tar.gz" in proc.stdout
    assert "--warm-share=/mnt/warm --warm-plan" in argv and not (tmp_path / "share").exists()


def test_a_key_the_cluster_does_not_hold_says_what_differs(tmp_path: Path) -> None:
    note = "the cluster's cache /s holds 1 other key(s); the nearest, abc, differs: gpu: ['H200 sm_90'] -> []"
    plan = _verdict(tmp_path, "plan", "planned", share_note=note)
    proc, _ = _play(tmp_path, _verdict(tmp_path, "w", "warmed", share_note=note), 0, plan=plan)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert f"Key {KEY} is not in the cluster's cache ({note})" in proc.stdout.replace("\n", " ")


def test_without_a_share_the_doctor_runs_once_as_before(tmp_path: Path) -> None:
    proc, argv = _play(tmp_path, H200 / "warm_tiny_again.json", 0, triton_warm_share_dir="")
    assert proc.returncode == 0 and "skipped: cache key already warm" in proc.stdout, proc.stdout[-3000:]
    assert len(argv.splitlines()) == 1 and "--warm-share" not in argv


def test_check_mode_starts_no_doctor_and_moves_no_cache(tmp_path: Path) -> None:
    share = tmp_path / "share"
    _artifact(share)
    proc, argv = _play(
        tmp_path, H200 / "warm_tiny.json", 0, flags=("--check",), triton_warm_share_dir=str(share)
    )
    assert proc.returncode == 0 and "changed=0" in proc.stdout, proc.stdout[-3000:]
    assert argv == "" and not (tmp_path / "stage").exists()
