"""upgrade.yml and rollback.yml on one real testbed container (CT 129): the new venv is built
beside the live one and becomes active only when the doctor passes; every failure leaves the old
venv active and working."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playbook_runner import REPO, PlaybookRun, container, make_runner

VMID = 129
CT = [container(VMID)]
TRITON37 = "torch211-triton37"


def inside(script: str) -> subprocess.CompletedProcess[str]:
    """A command in the real container, straight through lxc-attach (not through the project)."""
    return subprocess.run(
        ["lxc-attach", "-n", str(VMID), "--clear-env", "--", "/bin/sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def active_triton() -> str:
    r = inside("/opt/mlstack/venv/bin/python -c 'import torch, triton; print(triton.__version__)'")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def active_venv() -> str:
    return inside("readlink /opt/mlstack/venv").stdout.strip()


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory, testbed: Any) -> Iterator[Any]:
    run = make_runner(tmp_path_factory.mktemp("upgrade"))
    first = run("provision.yml", CT)
    assert first.rc == 0, first.output[-4000:]
    yield run
    run("destroy.yml", CT, mlstack_destroy_confirm=True)


@pytest.fixture
def broken_profiles(tmp_path: Path) -> Path:
    """A profiles folder holding 'broken-lock': the default profile locked for Python >= 3.14, which
    the container's Python 3.11 cannot install (`uv sync --frozen` refuses it)."""
    src = REPO / "profiles" / "torch211-triton36"
    dst = tmp_path / "profiles" / "broken-lock"
    shutil.copytree(src, dst)
    for name in ("pyproject.toml", "uv.lock"):
        text = (dst / name).read_text()
        text, n = re.subn(r"^requires-python = .*$", 'requires-python = ">=3.14"', text, count=1, flags=re.M)
        assert n == 1, name
        (dst / name).write_text(text)
    return dst.parent


def test_doctor_failure_keeps_the_old_venv(runner: Any) -> None:
    before = active_venv()
    assert inside("mv /usr/bin/gcc /usr/bin/gcc.hidden").returncode == 0
    try:
        result: PlaybookRun = runner("upgrade.yml", CT, mlstack_upgrade_profile=TRITON37)
    finally:
        inside("mv /usr/bin/gcc.hidden /usr/bin/gcc")
    assert result.rc != 0
    # The new venv was built (the play says how long it took) and then refused by the doctor.
    assert re.search(r"mlstack-build-venv: built\s+\S+triton37\S*\s+in\s+[0-9.]+ s \(uv: ", result.output)
    assert "NO_C_COMPILER" in result.output
    assert active_venv() == before
    assert active_triton() == "3.6.0"


def test_upgrade_switches_when_the_doctor_passes(runner: Any) -> None:
    before = active_venv()
    result = runner("upgrade.yml", CT, mlstack_upgrade_profile=TRITON37)
    assert result.rc == 0, result.output[-4000:]
    assert active_triton() == "3.7.1"
    assert inside("readlink /opt/mlstack/venv.previous").stdout.strip() == before
    env = inside("cat /etc/profile.d/mlstack.sh").stdout
    assert f"TRITON_CACHE_DIR=/var/cache/mlstack/triton/{Path(active_venv()).name}" in env


def test_a_lock_that_cannot_install_keeps_the_old_venv(runner: Any, broken_profiles: Path) -> None:
    before = active_venv()
    result = runner(
        "upgrade.yml",
        CT,
        mlstack_upgrade_profile="broken-lock",
        ml_venv_profiles_dir=str(broken_profiles),
        gpu_container_profiles_dir=str(broken_profiles),
    )
    assert result.rc != 0
    said = " ".join(result.output.split())
    assert "Python >=3.14" in said and "the active venv is untouched" in said, said[-3000:]
    assert active_venv() == before
    assert active_triton() == "3.7.1"


def test_rollback_returns_to_the_previous_venv(runner: Any) -> None:
    previous = inside("readlink /opt/mlstack/venv.previous").stdout.strip()
    result = runner("rollback.yml", CT)
    assert result.rc == 0, result.output[-4000:]
    assert active_venv() == previous
    assert active_triton() == "3.6.0"
