"""A driver upgrade on the node, end to end on one real testbed container (CT 134): the node runs NVIDIA
kernel module 550.54.14 and provision.yml installs that driver userspace (the testbed's stand-in NVIDIA
runfile: real libcuda.so.550.54.14 and libnvidia-ml objects, ldconfig); the node is upgraded to
560.35.03; verify.yml names the container as mismatched, in its output and in the fleet report with the
fix, and the drift view shows the driver change; provision.yml brings it back to the node's version, the
doctor green; a rerun changes nothing. The node's driver is global state of the shared testbed: set back
to none at the end, whatever happened."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlstack_testbed.node import nvdriver
from playbook_runner import TESTBED_CLI, PlaybookRun, container, make_runner
from tbhelpers import attach, ssh

VMID = 134
NAME = f"testbed-ct{VMID}"
# No scheduled doctor in it: this test is about the driver, and the monitor's tasks cost time.
CT = [container(VMID, mlstack_monitor=False)]
V1, V2 = "550.54.14", "560.35.03"
# What read_version.yml asks inside: the file libcuda.so.1 resolves to through the linker cache.
LIBCUDA = "readlink -f \"$(ldconfig -p | sed -n 's/.*libcuda\\.so\\.1 .*=> //p' | head -n1)\""


def set_driver(version: str | None) -> None:
    """The kernel module the testbed's nodes report (None: no driver). Global state of the shared testbed
    (tests/lanes.py: a node-exclusive step); whoever sets one puts None back."""
    if os.environ.get("MLSTACK_TESTBED_SHARED") == "1":
        raise RuntimeError(
            f"set_driver({version!r}) changes the shared testbed for every step running at once: "
            "name this test file in tests/lanes.py's node-state step"
        )
    argv = [str(TESTBED_CLI), "up", "--gpu-nodes", "2"] + (["--driver-version", version] if version else [])
    r = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{r.stdout}\n{r.stderr}")


@pytest.fixture
def upgrade_run(tmp_path: Path, testbed: Any) -> Iterator[tuple[Any, Path, dict[str, float]]]:
    """A runner whose fleet report is this test's own, the two runfiles, the node at V1; afterwards the
    container destroyed and the node without a driver."""
    run = make_runner(tmp_path)
    runfiles = tmp_path / "nvidia"
    for version in (V1, V2):
        nvdriver.runfile(version, runfiles)
    reports = tmp_path / "reports"
    reports.mkdir()
    extra = {
        "nvidia_userspace_runfile_dir": str(runfiles),
        "fleet_report_dir": str(reports),
        "doctor_controller_report_dir": str(reports / "doctor"),
    }
    times: dict[str, float] = {}

    def timed(step: str, playbook: str, **more: Any) -> PlaybookRun:
        t0 = time.monotonic()
        result = run(playbook, CT, **extra, **more)
        times[step] = round(time.monotonic() - t0, 1)
        (reports / f"{step}.log").write_text(result.output)  # beside the fleet report, for a failure
        return result

    set_driver(V1)
    try:
        yield timed, reports, times
    finally:
        try:
            set_driver(None)
        finally:
            run("destroy.yml", CT, mlstack_destroy_confirm=True)
            print(f"\ndriver upgrade e2e, seconds per step: {times}")


def libcuda_inside() -> str:
    r = attach(VMID, LIBCUDA)
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def fleet(reports: Path) -> dict[str, Any]:
    return json.loads((reports / "fleet.json").read_text())


def doctor_green(reports: Path) -> None:
    report = json.loads((reports / "doctor" / f"{NAME}.json").read_text())
    failed = [(p["name"], p.get("code")) for p in report["probes"] if p["status"] == "fail"]
    assert report["summary"]["ok"] and not failed, failed


def test_a_node_driver_upgrade_is_named_by_verify_and_repaired_by_provision(
    upgrade_run: tuple[Any, Path, dict[str, float]], testbed: Any
) -> None:
    run, reports, _ = upgrade_run
    # Only the node's SSH namespace sees the module; the machine and the container keep their own /proc.
    assert V1 in ssh(testbed, "cat /proc/driver/nvidia/version").stdout
    assert not Path("/proc/driver/nvidia/version").exists()

    first = run("provision", "provision.yml")
    assert first.rc == 0, first.output[-4000:]
    assert libcuda_inside() == f"/usr/lib/x86_64-linux-gnu/libcuda.so.{V1}"
    assert attach(VMID, "test -e /proc/driver/nvidia/version").returncode != 0
    assert "Run the installer without its kernel module" in " ".join(first.changed_tasks())
    doctor_green(reports)
    row = next(r for r in fleet(reports)["containers"] if r["container"] == NAME)
    assert row["driver_userspace"]["status"] == "match" and row["seen"]["libcuda"] == V1

    set_driver(V2)
    verify = run("verify", "verify.yml", mlstack_verify_tier="fast")  # the check runs at every tier
    # One line each (the YAML callback doubles a quote inside a quoted message: undone here).
    said = " ".join(verify.output.split()).replace("''", "'")
    # verify.yml fails, after its report, naming the container, both versions and the fix.
    assert verify.rc != 0, said[-4000:]
    assert (
        f"{NAME} (vmid {VMID}): driver userspace MISMATCH: "
        f"libcuda {V1} inside, the node's kernel module is {V2}"
    ) in said, said[-6000:]
    assert (
        f"{NAME} (vmid {VMID}, node testbed): libcuda {V1}, kernel module {V2}. Fix: rerun provision.yml"
        in said
    )
    # Nothing changed by the check; the doctor's wheel is reinstalled only where the checkout's changed.
    assert [t for t in verify.changed_tasks() if "[doctor :" not in t] == [], verify.changed_tasks()
    doctor_green(reports)  # --no-gpu: the doctor passes beside the stub libcuda; the check is what names it
    report = fleet(reports)
    assert [(m["container"], m["driver"], m["libcuda"]) for m in report["userspace_mismatches"]] == [
        (NAME, V2, V1)
    ]
    assert f"NVIDIA-Linux-x86_64-{V2}.run" in report["userspace_mismatches"][0]["fix"]
    assert f"driver: {V1} -> {V2}" in report["drift"]["containers"][NAME]
    md = (reports / "fleet.md").read_text()
    assert f"| {NAME} | {VMID} | testbed | {V2} | {V1} | rerun provision.yml" in md
    drift_line = next(line for line in md.splitlines() if line.startswith(f"| {NAME} | ") and "->" in line)
    assert f"driver: {V1} -> {V2}" in drift_line, md

    repair = run("repair", "provision.yml")
    assert repair.rc == 0, repair.output[-4000:]
    assert libcuda_inside() == f"/usr/lib/x86_64-linux-gnu/libcuda.so.{V2}"
    # The previous driver's libraries are gone, as the real installer removes them.
    left = attach(VMID, "ls /usr/lib/x86_64-linux-gnu/ | grep -E '^lib(cuda|nvidia-ml)\\.so'").stdout.split()
    assert sorted(left) == sorted(
        [
            "libcuda.so",
            "libcuda.so.1",
            f"libcuda.so.{V2}",
            "libnvidia-ml.so",
            "libnvidia-ml.so.1",
            f"libnvidia-ml.so.{V2}",
        ]
    )
    assert repair.changed() > 0 and "Run the installer without its kernel module" in " ".join(
        repair.changed_tasks()
    )
    doctor_green(reports)
    report = fleet(reports)
    assert report["userspace_mismatches"] == []
    assert f"libcuda: {V1} -> {V2}" in report["drift"]["containers"][NAME]
    assert (
        "All 1 container(s) compared match their node's kernel module." in (reports / "fleet.md").read_text()
    )

    again = run("rerun", "provision.yml")
    assert again.rc == 0, again.output[-4000:]
    assert again.changed() == 0, again.changed_tasks()
