"""The gpu_boot role's hookscript, as PVE runs it (`mlstack-gpu-hook <vmid> pre-start`), in a mount namespace
of its own (root): a /dev of its own (null and one GPU node), /usr/sbin showing the case's `pct` and
`nvidia-modprobe`, /proc/driver and /proc/devices the case's driver, and the case's records' and status
folders. One case per cause it names, and the starts it lets through."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import jinja2
import pytest
import yaml

ROLE = Path(__file__).resolve().parents[3] / "roles" / "gpu_boot"
VARS = yaml.safe_load((ROLE / "vars" / "main.yml").read_text())
RECORDS, STATUS = VARS["_gpu_boot_record_dir"], VARS["_gpu_boot_status_dir"]
# The GPU node the case's /dev has, and one it lacks.
PRESENT, ABSENT = "/dev/nvidia0", "/dev/nvidia7"
VERSION_LINE = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  {}  Release Build  (dvs-builder@U16)  Tue\n"
)

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare"
)


def render() -> str:
    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    env.filters["quote"] = shlex.quote
    return env.from_string((ROLE / "templates" / "mlstack-gpu-hook.j2").read_text()).render(
        _gpu_boot_record_dir=RECORDS, _gpu_boot_status_dir=STATUS
    )


def run_hook(
    tmp_path: Path, devices: list[str], record: str | None, driver: str | None, modprobe: str = "exit 0"
) -> tuple[subprocess.CompletedProcess[str], str]:
    """The hook for CT 700 whose devN entries are `devices`; its status file's text ('' when none)."""
    sbin, proc, records, status = (tmp_path / d for d in ("sbin", "proc", "records", "status"))
    for d in (sbin, proc / "nvidia", records, status):
        d.mkdir(parents=True, exist_ok=True)
    config = "".join(f"dev{i}: {p},gid=44,mode=0666\n" for i, p in enumerate(devices)) + "hostname: t\n"
    (tmp_path / "config").write_text(config + "[snap]\ndev9: /dev/nvidia-in-a-snapshot\n")
    (tmp_path / "devices").write_text("Character devices:\n  1 mem\n\nBlock devices:\n  8 sd\n")
    (sbin / "pct").write_text(f'#!/bin/sh\n[ "$1" = config ] && exec cat {tmp_path}/config\nexit 2\n')
    (sbin / "nvidia-modprobe").write_text(f"#!/bin/sh\n{modprobe}\n")
    for f in sbin.iterdir():
        f.chmod(0o755)
    if driver:
        (proc / "nvidia" / "version").write_text(VERSION_LINE.format(driver))
    if record:
        (records / "700").write_text(record + "\n")
    hook = tmp_path / "hook"
    hook.write_text(render())
    hook.chmod(0o755)
    inner = " && ".join(
        [
            "mount -t tmpfs none /dev",
            "mknod -m 666 /dev/null c 1 3",
            f"mknod -m 666 {PRESENT} c 195 0",
            f"mount --bind {tmp_path}/devices /proc/devices",
            f"mount -t overlay none -o lowerdir={sbin}:/usr/sbin /usr/sbin",
            f"mount --bind {proc} /proc/driver" if Path("/proc/driver").is_dir() else "true",
            f"mkdir -p {RECORDS} {STATUS}",
            f"mount --bind {records} {RECORDS}",
            f"mount --bind {status} {STATUS}",
            f"exec {hook} 700 pre-start",
        ]
    )
    r = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", inner],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    blocked = status / "700"
    return r, blocked.read_text() if blocked.exists() else ""


@pytest.mark.parametrize(
    ("record", "driver", "reason", "words"),
    [
        (
            "550.54.14",
            "560.35.03",
            "driver_version_changed",
            "is 560.35.03 but the container's driver userspace is 550.54.14",
        ),
        ("550.54.14", None, "driver_missing", "no NVIDIA kernel module loaded"),
    ],
    ids=["driver-changed", "driver-gone"],
)
def test_a_driver_the_userspace_was_not_installed_for_refuses_the_start(
    tmp_path: Path, record: str, driver: str | None, reason: str, words: str
) -> None:
    if driver is None and not Path("/proc/driver").is_dir():
        pytest.skip("this kernel has no /proc/driver to hide a driver behind")
    r, status = run_hook(tmp_path, [PRESENT], record, driver)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "mlstack-gpu-hook: CT 700 not started: the node" in r.stderr and words in r.stderr, r.stderr
    assert "then `pct start 700`." in r.stderr
    assert status.splitlines()[0] == f"reason={reason}", status


@pytest.mark.parametrize(
    ("modprobe", "reason", "words"),
    [
        (
            "echo 'modprobe: FATAL: Module nvidia not found' >&2; exit 1",
            "module_load_failed",
            f"{ABSENT} missing and `nvidia-modprobe -c=7` failed (exit 1): modprobe: FATAL: Module nvidia",
        ),
        (
            "exit 0",
            "device_missing",
            f"{ABSENT} missing: neither `nvidia-modprobe -c=7` nor /proc/devices makes it",
        ),
    ],
    ids=["module-fails", "no-such-node"],
)
def test_a_node_that_cannot_be_made_refuses_the_start(
    tmp_path: Path, modprobe: str, reason: str, words: str
) -> None:
    r, status = run_hook(tmp_path, [PRESENT, ABSENT], None, None, modprobe)
    assert r.returncode == 1, r.stdout + r.stderr
    assert words in r.stderr, r.stderr
    assert status.splitlines()[0] == f"reason={reason}", status


@pytest.mark.parametrize(
    ("record", "driver", "devices"),
    [("560.35.03", "560.35.03", True), (None, None, True), ("550.54.14", "560.35.03", False)],
    ids=["same-driver", "no-record", "no-gpus"],
)
def test_the_start_goes_on_and_an_old_refusal_is_cleared(
    tmp_path: Path, record: str | None, driver: str | None, devices: bool
) -> None:
    (tmp_path / "status").mkdir()
    (tmp_path / "status" / "700").write_text("reason=device_missing\nmessage=before\n")
    r, status = run_hook(tmp_path, [PRESENT] if devices else [], record, driver)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stderr == "" and status == ""
