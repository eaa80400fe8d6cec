"""The doctor typed by hand in a provisioned container (CT 150, shared with test_monitor.py) checks what
provisioning checked: the doctor role wrote the container's settings once (/etc/mlstack/doctor.json),
and `mlstack-doctor --no-gpu --json` with no other argument checks the lock the active venv was built
from (the default profile, torch211-triton37-fla06), its purpose and Triton cache, and names the shipped
profile the stack is. The same doctor without the settings pins nothing of ours and is green on that
stack too; the timers run that command too, restating none of the settings."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from playbook_runner import DEFAULT_CT_VMID, DEFAULT_PROFILE, PlaybookRun

VMID = DEFAULT_CT_VMID
DOCTOR = "/opt/mlstack/venv/bin/mlstack-doctor"

pytestmark = pytest.mark.testbed


def sh(script: str, timeout: float = 600) -> Any:
    from tbhelpers import attach

    # As a person logged in as root would: a HOME and the usual PATH.
    return attach(VMID, f"export HOME=/root PATH=/usr/local/bin:/usr/bin:/bin; {script}", timeout=timeout)


def doctor_json(args: str, env: str = "") -> tuple[int, dict[str, Any], str]:
    r = sh(f"cd /root && {env} {DOCTOR} {args}")
    try:
        report = json.loads(r.stdout)
    except ValueError:
        report = {}
    return r.returncode, report, r.stderr


def probe(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in report["probes"] if p["name"] == name)


@pytest.fixture(scope="module")
def provisioned(default_ct: tuple[PlaybookRun, Any]) -> PlaybookRun:
    """CT 150's first provision (conftest.py's default_ct)."""
    return default_ct[0]


def test_the_doctor_role_writes_the_containers_settings(provisioned: PlaybookRun) -> None:
    assert provisioned.rc == 0, provisioned.output[-4000:]
    r = sh("cat /etc/mlstack/doctor.json && stat -c %a /etc/mlstack/doctor.json")
    assert r.returncode == 0, r.stderr
    text, mode = r.stdout.rsplit("}", 1)
    found = json.loads(text + "}")
    assert mode.strip() == "644"
    assert found == {
        "venv": "/opt/mlstack/venv",
        "lock": "/opt/mlstack/venv/uv.lock",
        "model": "tiny",
        "purpose": "training",
        "expect_gpu": False,  # the testbed's node: mlstack_doctor_expect_gpu false
        "triton_cache_root": "/var/cache/mlstack/triton",
    }


def test_the_doctor_by_hand_checks_the_active_profile(provisioned: PlaybookRun) -> None:
    assert provisioned.rc == 0, provisioned.output[-4000:]
    rc, report, err = doctor_json("--no-gpu --json")
    assert rc == 0, (err[-2000:], report.get("summary"))
    versions = probe(report, "package_versions")
    assert versions["status"] == "pass", versions
    used = versions["evidence"]["profile"]
    active = sh("readlink -f /opt/mlstack/venv").stdout.strip()
    # The lock the active venv was built from: its folder is named after the profile and the lock's hash.
    assert used["source"] == f"{active}/uv.lock" and used["name"].startswith(DEFAULT_PROFILE + "-"), used
    assert used["expect"]["triton"] == "3.7.1" and used["expect"]["flash-linear-attention"] == "0.6.0"
    assert versions["evidence"]["matches_shipped"] == [DEFAULT_PROFILE]
    assert f"the stack is shipped profile {DEFAULT_PROFILE}" in versions["summary"]
    opts = report["options"]
    assert opts["settings"] == "/etc/mlstack/doctor.json" and opts["tier"] == "quick"
    assert opts["purpose"] == "training" and opts["model"] == "tiny" and opts["expect_gpu"] is False
    assert opts["triton_cache_dir"] == f"/var/cache/mlstack/triton/{os.path.basename(active)}"
    pin = probe(report, "torch_triton_pin")
    assert pin["status"] == "pass" and "overrides torch's pin" in pin["summary"], pin


def test_the_settings_say_no_gpu_is_expected(provisioned: PlaybookRun) -> None:
    assert provisioned.rc == 0, provisioned.output[-4000:]
    rc, report, err = doctor_json("--tier fast --json")
    assert rc == 0, (err[-2000:], report.get("summary"))
    assert report["options"]["expect_gpu"] is False


def test_without_the_settings_the_doctor_pins_nothing_and_names_the_profile(provisioned: PlaybookRun) -> None:
    assert provisioned.rc == 0, provisioned.output[-4000:]
    rc, report, err = doctor_json("--tier fast --no-gpu --json", env="MLSTACK_DOCTOR_SETTINGS=")
    assert rc == 0, (err[-2000:], report.get("summary"))
    versions = probe(report, "package_versions")
    assert versions["evidence"]["profile"]["name"] == "none" and report["options"]["settings"] is None
    assert versions["evidence"]["matches_shipped"] == [DEFAULT_PROFILE], versions


def test_a_scheduled_run_is_the_same_command(provisioned: PlaybookRun) -> None:
    assert provisioned.rc == 0, provisioned.output[-4000:]
    # The timers stopped, so that no scheduled run interleaves; then the fast tier's run, by hand.
    # They start again after it: the container is shared (conftest.py's default_ct).
    r = sh(
        "systemctl stop mlstack-doctor-fast.timer mlstack-doctor-quick.timer"
        " && systemctl start mlstack-doctor-fast.service"
        " && cat /var/lib/mlstack/metrics/doctor-fast.json;"
        " rc=$?; systemctl start mlstack-doctor-fast.timer mlstack-doctor-quick.timer && exit $rc"
    )
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    report = json.loads(r.stdout)
    assert report["summary"]["ok"] is True, report["summary"]
    assert (
        report["options"]["settings"] == "/etc/mlstack/doctor.json"
        and report["options"]["expect_gpu"] is False
    )
    active = sh("readlink -f /opt/mlstack/venv").stdout.strip()
    assert probe(report, "package_versions")["evidence"]["profile"]["source"] == f"{active}/uv.lock"
    # The script's overrides are empty: the settings file holds them.
    script = sh("cat /usr/local/sbin/mlstack-doctor-monitor").stdout
    for name in ("model", "purpose", "expect_gpu", "triton_cache_root"):
        assert f"\n{name}=''\n" in script, script[:800]
