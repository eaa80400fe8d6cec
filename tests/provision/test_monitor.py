"""The doctor's scheduled runs (roles/doctor_monitor) in a real testbed container (CT 150, shared with
test_doctor_defaults.py): provision.yml
installs and schedules them under the container's systemd, a run started by hand writes the Prometheus
metrics, a second run at once is refused by the lock, a busy GPU makes the daily tier skip with its
reason in the metrics, another daily tier replaces the old units, and mlstack_monitor: false in the
container's entry removes it all. That a second provision changes nothing, the monitor included, is
test_lifecycle.py's.

The testbed's GPU nodes have no driver: the busy GPU is a `nvidia-smi` stub on the service's PATH
printing a pid, or a process holding /dev/nvidia0 open with O_PATH (the only open a node without a
driver allows). The timers are stopped before the runs by hand, so that no scheduled run interleaves."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from typing import Any

import pytest
from playbook_runner import DEFAULT_CT_VMID, PlaybookRun, container

VMID = DEFAULT_CT_VMID
CT = [container(VMID)]
PROM = "/var/lib/mlstack/metrics/doctor.prom"
LOCK = "/run/lock/mlstack-doctor-monitor.lock"
UNITS = ("mlstack-doctor-fast.timer", "mlstack-doctor-quick.timer")
SKIPPED_SINCE = 'mlstack_doctor_run_skipped_since_timestamp_seconds{tier="quick",reason="gpu_busy"}'

pytestmark = pytest.mark.testbed


def sh(script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    from tbhelpers import attach

    return attach(VMID, script, timeout=timeout)


def ok(script: str, timeout: float = 120) -> str:
    r = sh(script, timeout)
    assert r.returncode == 0, f"{script}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def samples(text: str) -> dict[str, float]:
    """`name{labels} value` lines as written, to their values (the format itself is checked by
    verify/tests/test_metrics.py and, here, by promtool when installed)."""
    return {m.group(1): float(m.group(2)) for m in re.finditer(r"^([a-z_]+(?:\{.*\})?) (\S+)$", text, re.M)}


def key(name: str, **labels: str) -> str:
    """A sample's name and labels as the doctor writes them (labels in its order)."""
    return name + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def check_format(text: str) -> None:
    if shutil.which("promtool"):
        r = subprocess.run(
            ["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=60
        )
        assert r.returncode == 0, r.stdout + r.stderr


def journal(unit: str, since: float) -> str:
    return ok(f"journalctl -u {unit} --since @{int(since)} --no-pager -o cat")


def wait_idle(unit: str, timeout: float = 600) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        state = sh(f"systemctl is-active {unit}").stdout.strip()
        if state not in ("active", "activating", "deactivating"):
            return state
        time.sleep(1)
    raise AssertionError(f"{unit} still running after {timeout}s")


@pytest.fixture(scope="module")
def run_playbook_module(default_ct: tuple[PlaybookRun, Any]) -> Any:
    return default_ct[1]


@pytest.fixture(scope="module")
def first_run(default_ct: tuple[PlaybookRun, Any]) -> PlaybookRun:
    """CT 150's first provision (conftest.py's default_ct, which test_doctor_defaults.py reads too)."""
    return default_ct[0]


def test_provision_enables_and_schedules_the_runs(first_run: PlaybookRun) -> None:
    assert first_run.rc == 0, first_run.output[-4000:]
    assert ok(f"systemctl is-enabled {' '.join(UNITS)}").split() == ["enabled", "enabled"]
    for unit in UNITS:
        # A timer whose run is under way shows no NEXT until the run ends (the fast tier's first run can
        # start right after the provision): read it once its service is idle.
        wait_idle(unit.replace(".timer", ".service"))
        listed = ok("systemctl list-timers --all --no-pager --no-legend 'mlstack-doctor-*'")
        line = next((ln for ln in listed.splitlines() if unit in ln), "")
        # NEXT is a date: the timer is scheduled (an unscheduled one shows "-" or "n/a" there).
        assert re.match(r"^\w{3} \d{4}-\d\d-\d\d \d\d:\d\d:\d\d", line), listed
    # The defaults: the fast tier every 5 minutes, the quick tier daily at 03:00.
    fast = ok("systemctl show -p TimersMonotonic --value mlstack-doctor-fast.timer")
    assert "OnUnitActiveUSec=5min" in fast, fast
    daily = ok("systemctl show -p TimersCalendar --value mlstack-doctor-quick.timer")
    assert "OnCalendar=*-*-* 03:00:00" in daily, daily


def test_a_run_by_hand_writes_the_metrics(first_run: PlaybookRun) -> None:
    ok(f"systemctl stop {' '.join(UNITS)}")
    for tier in ("fast", "quick"):
        wait_idle(f"mlstack-doctor-{tier}.service")
    ok(f"rm -f {PROM} /var/lib/mlstack/metrics/doctor-fast.json")
    before = time.time()
    ok("systemctl start mlstack-doctor-fast.service", timeout=360)
    text = ok(f"cat {PROM}")
    check_format(text)
    got = samples(text)
    assert got['mlstack_doctor_ok{tier="fast"}'] == 1, text
    assert got['mlstack_doctor_failed_probes{tier="fast"}'] == 0, text
    for probe, stage in (("c_extension_build", "toolchain"), ("package_versions", "packages")):
        assert got[key("mlstack_doctor_probe_ok", tier="fast", probe=probe, stage=stage, code="")] == 1, text
    # --no-gpu on the testbed: the driver probe is skipped, so it has no verdict, only a skip line.
    assert not [k for k in got if k.startswith("mlstack_doctor_probe_ok") and "nvidia_driver" in k]
    skip = key(
        "mlstack_doctor_probe_skipped", tier="fast", probe="nvidia_driver", stage="host", skipped_by=""
    )
    assert got[skip] == 1, text
    info = next(k for k in got if k.startswith("mlstack_doctor_stack_info{"))
    assert 'profile="torch211-triton37-fla06-' in info and 'torch="2.11.0",triton="3.7.1",fla="0.6.0"' in info
    last = got['mlstack_doctor_last_run_timestamp_seconds{tier="fast"}']
    assert before - 1 <= last <= time.time() + 1
    assert 0 < got['mlstack_doctor_run_duration_seconds{tier="fast"}'] < 300
    report = json.loads(ok("cat /var/lib/mlstack/metrics/doctor-fast.json"))
    assert report["tier"] == "fast" and report["summary"]["ok"] is True
    assert ok("systemctl show -p Result --value mlstack-doctor-fast.service").strip() == "success"


def test_the_node_gathers_its_containers_metrics_into_one_file(first_run: PlaybookRun, testbed: Any) -> None:
    from tbhelpers import ssh

    # provision.yml installed the node's command (the testbed's node runs no systemd: no timer, said so).
    said = " ".join(first_run.output.split())
    assert "does not run systemd: /usr/local/sbin/mlstack-node-metrics is installed but not scheduled" in said
    out = f"/tmp/mlstack-node-metrics-test-{VMID}.prom"
    r = ssh(testbed, f"/usr/local/sbin/mlstack-node-metrics --out {out} --containers {VMID}", timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"{VMID}: ok" in r.stdout, r.stdout
    text = ssh(testbed, f"cat {out} && rm -f {out}").stdout
    check_format(text)
    got = samples(text)
    assert got[key("mlstack_node_container_metrics_ok", vmid=str(VMID))] == 1, text
    assert got[f'mlstack_doctor_ok{{vmid="{VMID}",tier="fast"}}'] == 1, text


def test_a_second_run_at_once_is_refused_by_the_lock(first_run: PlaybookRun) -> None:
    fast_before = samples(ok(f"cat {PROM}"))['mlstack_doctor_last_run_timestamp_seconds{tier="fast"}']
    since = time.time() - 1
    ok("systemctl start --no-block mlstack-doctor-quick.service")
    # The quick run says this once it holds the lock, which it keeps for its whole run (tens of seconds
    # here: it imports torch). Probing the lock with flock would take it for a moment.
    deadline = time.monotonic() + 60
    while "no job holds the GPUs: running" not in journal("mlstack-doctor-quick.service", since):
        assert time.monotonic() < deadline, journal("mlstack-doctor-quick.service", since)
        time.sleep(0.2)
    ok("systemctl start mlstack-doctor-fast.service", timeout=60)
    said = journal("mlstack-doctor-fast.service", since)
    assert f"another doctor run holds {LOCK}; skipping this one" in said, said
    assert samples(ok(f"cat {PROM}"))['mlstack_doctor_last_run_timestamp_seconds{tier="fast"}'] == fast_before
    # The quick run finishes and adds its tier beside the fast one.
    state = wait_idle("mlstack-doctor-quick.service")
    assert state == "inactive", journal("mlstack-doctor-quick.service", since)
    text = ok(f"cat {PROM}")
    check_format(text)
    got = samples(text)
    assert got['mlstack_doctor_ok{tier="quick"}'] == 1 and got['mlstack_doctor_ok{tier="fast"}'] == 1, text
    assert got['mlstack_doctor_probe_ok{tier="quick",probe="model_config",stage="model",code=""}'] == 1


def test_a_run_started_by_hand_waits_for_the_lock(first_run: PlaybookRun) -> None:
    # What docs/monitoring.md's `systemctl start mlstack-doctor-quick.service` meets when a fast run is
    # under way: it waits for it, then writes its own verdict, instead of vanishing without one.
    quick_before = samples(ok(f"cat {PROM}"))['mlstack_doctor_last_run_timestamp_seconds{tier="quick"}']
    # The holder keeps the lock until the quick run has said that it waits (no holding time for a loaded
    # machine to outlast before the run even reaches the lock).
    ok(f"systemd-run --unit=lock-holder --quiet flock {LOCK} sleep infinity")
    try:
        # flock starts its command once it holds the lock.
        deadline = time.monotonic() + 30
        while not sh('pgrep -x sleep -P "$(systemctl show -p MainPID --value lock-holder.service)"').stdout:
            assert time.monotonic() < deadline, "the lock holder did not take the lock"
            time.sleep(0.2)
        since = time.time() - 1
        ok("systemctl start --no-block mlstack-doctor-quick.service")
        waiting = f"another doctor run holds {LOCK}; waiting for it"
        deadline = time.monotonic() + 120
        while waiting not in (said := journal("mlstack-doctor-quick.service", since)):
            assert time.monotonic() < deadline, said
            time.sleep(0.5)
    finally:
        sh("systemctl stop lock-holder.service")
    # Once the lock is free it runs to its end and writes its own verdict.
    state = wait_idle("mlstack-doctor-quick.service")
    said = journal("mlstack-doctor-quick.service", since)
    assert state == "inactive" and "passed: metrics in" in said, said
    got = samples(ok(f"cat {PROM}"))
    assert got['mlstack_doctor_last_run_timestamp_seconds{tier="quick"}'] > quick_before, got
    assert got['mlstack_doctor_ok{tier="quick"}'] == 1


def test_a_busy_gpu_skips_the_daily_run_with_the_reason(first_run: PlaybookRun) -> None:
    quick_run = samples(ok(f"cat {PROM}"))['mlstack_doctor_last_run_timestamp_seconds{tier="quick"}']
    # nvidia-smi answers with a compute process (the service's PATH has /usr/local/bin first).
    ok(
        "printf '%s\\n' '#!/bin/sh' 'case \"$*\" in *--query-compute-apps=pid*) echo 4242;; *) exit 9;; esac'"
        " > /usr/local/bin/nvidia-smi && chmod 755 /usr/local/bin/nvidia-smi"
    )
    try:
        since = time.time() - 1
        first_skip = time.time()
        ok("systemctl start mlstack-doctor-quick.service", timeout=120)
        said = journal("mlstack-doctor-quick.service", since)
        assert "skipping: the GPUs are busy (nvidia-smi lists GPU compute processes: 4242)" in said, said
        text = ok(f"cat {PROM}")
        check_format(text)
        got = samples(text)
        assert got['mlstack_doctor_run_skipped{tier="quick",reason="gpu_busy"}'] == 1, text
        streak = got[SKIPPED_SINCE]
        assert first_skip - 1 <= streak <= time.time() + 1
        # The last verdict of the tier stays; the fast tier (no GPU memory, no compute) still runs.
        assert got['mlstack_doctor_last_run_timestamp_seconds{tier="quick"}'] == quick_run
        fast_before = got['mlstack_doctor_last_run_timestamp_seconds{tier="fast"}']
        time.sleep(1)
        ok("systemctl start mlstack-doctor-fast.service", timeout=360)
        got = samples(ok(f"cat {PROM}"))
        assert got['mlstack_doctor_last_run_timestamp_seconds{tier="fast"}'] > fast_before
        assert got['mlstack_doctor_run_skipped{tier="quick",reason="gpu_busy"}'] == 1
    finally:
        ok("rm -f /usr/local/bin/nvidia-smi")

    # Without nvidia-smi: a process of this container holding the GPU open is a busy GPU too.
    ok(
        "systemd-run --unit=fake-training --quiet /usr/bin/python3 -c "
        "'import os, time; fd = os.open(\"/dev/nvidia0\", os.O_PATH); time.sleep(600)'"
    )
    try:
        pid = ""
        for _ in range(50):
            pid = ok("systemctl show -p MainPID --value fake-training.service").strip()
            if pid not in ("", "0") and sh(f"find /proc/{pid}/fd -lname /dev/nvidia0").stdout.strip():
                break
            time.sleep(0.2)
        since = time.time() - 1
        ok("systemctl start mlstack-doctor-quick.service", timeout=120)
        said = journal("mlstack-doctor-quick.service", since)
        assert "nvidia-smi not found: it cannot say whether the GPUs are busy" in said, said
        assert f"processes hold a GPU device open: {pid} (python3)" in said, said
        got = samples(ok(f"cat {PROM}"))
        # The same streak: it began at the first skip.
        assert got[SKIPPED_SINCE] == streak
    finally:
        sh("systemctl stop fake-training.service")

    # The job is gone: the daily tier runs again, and the skip is cleared.
    ok("systemctl start mlstack-doctor-quick.service", timeout=600)
    got = samples(ok(f"cat {PROM}"))
    assert not [k for k in got if k.startswith("mlstack_doctor_run_skipped")], got
    assert got['mlstack_doctor_last_run_timestamp_seconds{tier="quick"}'] > quick_run


def test_another_daily_tier_replaces_the_old_units(first_run: PlaybookRun, run_playbook_module: Any) -> None:
    assert 'mlstack_doctor_ok{tier="quick"}' in ok(f"cat {PROM}")
    moved = run_playbook_module("provision.yml", CT, doctor_monitor_daily_tier="full")
    assert moved.rc == 0, moved.output[-4000:]
    listed = ok("systemctl list-timers --all --no-pager --no-legend 'mlstack-doctor-*'")
    assert "mlstack-doctor-full.timer" in listed and "mlstack-doctor-quick" not in listed, listed
    assert ok("ls /etc/systemd/system/ | grep mlstack-doctor-").split() == [
        "mlstack-doctor-fast.service",
        "mlstack-doctor-fast.timer",
        "mlstack-doctor-full.service",
        "mlstack-doctor-full.timer",
    ]
    # The quick tier's series would go stale in the file: it was removed, and the scheduled tiers write it
    # again (the fast timer, started again, may have run already).
    assert 'tier="quick"' not in sh(f"cat {PROM}").stdout


def test_opting_out_removes_the_runs(first_run: PlaybookRun, run_playbook_module: Any) -> None:
    # A daily run under way as the runs are removed (here waiting for the lock another run holds, as it
    # would behind a fast run): it is stopped with its units, so it cannot write the metrics afterwards.
    daily = next(
        u
        for u in ok("ls /etc/systemd/system").split()
        if u.startswith("mlstack-doctor-") and u.endswith(".service") and "-fast." not in u
    )
    ok(f"systemd-run --unit=lock-holder-optout --quiet flock {LOCK} sleep 600")
    try:
        ok(f"systemctl start --no-block {daily}")
        for _ in range(100):
            if sh(f"systemctl is-active {daily}").stdout.strip() == "activating":
                break
            time.sleep(0.1)
        assert sh(f"systemctl is-active {daily}").stdout.strip() == "activating"
        off = run_playbook_module("provision.yml", [container(VMID, mlstack_monitor=False)])
        assert off.rc == 0, off.output[-4000:]
        assert sh(f"systemctl is-active {daily}").stdout.strip() not in ("active", "activating"), (
            f"{daily} still runs after the runs were removed"
        )
    finally:
        sh("systemctl stop lock-holder-optout")
    assert not ok("systemctl list-timers --all --no-pager --no-legend 'mlstack-doctor-*'").strip()
    left = ok(
        f"ls /etc/systemd/system/mlstack-doctor-* /usr/local/sbin/mlstack-doctor-monitor {PROM} 2>&1 || true"
    )
    assert left.count("No such file or directory") == 3, left
    # CT 150 is shared (conftest.py's default_ct): its default entry schedules the runs again.
    back = run_playbook_module("provision.yml", CT)
    assert back.rc == 0, back.output[-4000:]
    assert ok(f"systemctl is-enabled {' '.join(UNITS)}").split() == ["enabled", "enabled"]
