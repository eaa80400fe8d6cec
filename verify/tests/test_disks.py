"""probes/disks.py through the real doctor (a subprocess, the fast tier): a nearly full filesystem the
stack writes to is a warning naming the path and the bytes, on a real tmpfs filled to its last MiB."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from doctor_testlib import SRC, run_doctor
from mlstack_doctor.probes import disks


def disk_probe(tmpdir: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(SRC), TMPDIR=str(tmpdir), MLSTACK_DOCTOR_SETTINGS="")
    run = run_doctor("--tier", "fast", "--no-gpu", env=env, timeout=60)
    assert run.report, run.stderr[-2000:]
    return next(p for p in run.report["probes"] if p["name"] == "disk_space")


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 8 MiB tmpfs, taken down afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mount)], check=True)
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def test_a_nearly_full_tmpdir_is_a_warning_naming_it(tmp_path: Path, small_disk: Path) -> None:
    (small_disk / "filler").write_bytes(b"\0" * (7 << 20))
    probe = disk_probe(small_disk)
    assert probe["status"] == "warn", probe
    assert probe["code"] == "DISK_NEARLY_FULL"
    assert f"{small_disk} (TMPDIR): " in probe["summary"] and "bytes free of 8388608" in probe["summary"]
    assert f"df -h {small_disk}" in probe["fix"]


@pytest.mark.parametrize(
    ("free", "total", "full"),
    [
        (2 << 30, 20 << 30, False),
        (1 << 29, 100 << 30, True),
        (3 << 30, 100 << 30, True),
        (6 << 30, 100 << 30, False),
    ],
)
def test_thresholds(free: int, total: int, full: bool) -> None:
    assert disks.nearly_full(free, total) is full
