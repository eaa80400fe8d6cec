"""upgrade.yml and rollback.yml on one real testbed container (CT 129), from the old default stack
(torch211-triton36) to the new one (torch211-triton37-fla06): the new venv is built beside the live
one and becomes active only when the doctor passes; every failure leaves the old venv active and
working. The container is for inference and names its stack in the inventory. It runs on the node as
the other steps find it (no driver), beside them; that the stack policy accepts this stack for inference
on H200s is test_policy_refusal.py's, with the node reporting them."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playbook_runner import DEFAULT_PROFILE, REPO, PlaybookRun, container, make_runner

VMID = 129
OLD = "torch211-triton36"
NEW = DEFAULT_PROFILE
CT = [container(VMID, profile=OLD, extras=[], purpose="inference")]


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


def active_fla() -> str:
    r = inside(
        "/opt/mlstack/venv/bin/python -c 'import importlib.metadata as m; print(m.version(\"fla-core\"))'"
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def active_venv() -> str:
    return inside("readlink /opt/mlstack/venv").stdout.strip()


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory, testbed: Any) -> Iterator[tuple[Any, PlaybookRun]]:
    run = make_runner(tmp_path_factory.mktemp("upgrade"))
    try:
        first = run("provision.yml", CT)
        yield run, first
    finally:
        run("destroy.yml", CT, mlstack_destroy_confirm=True)


@pytest.fixture(scope="module")
def runner(first_run: tuple[Any, PlaybookRun]) -> Any:
    run, first = first_run
    assert first.rc == 0, first.output[-4000:]
    return run


def test_the_old_stack_is_provisioned_as_the_inventory_names_it(first_run: tuple[Any, PlaybookRun]) -> None:
    said = " ".join(first_run[1].output.split())
    assert first_run[1].rc == 0, said[-4000:]
    assert f"CT {VMID}: profile {OLD}, extras [], purpose inference" in said, said[-4000:]
    assert active_triton() == "3.6.0"
    fleet = json.loads((REPO / "reports" / "fleet.json").read_text())
    row = next(r for r in fleet["containers"] if str(r["vmid"]) == str(VMID))
    assert (row["profile"], row["extras"], row["purpose"]) == (OLD, [], "inference")
    assert (row["profile_from"], row["extras_from"]) == ("inventory", "inventory")
    md = (REPO / "reports" / "fleet.md").read_text()
    assert f"| {OLD} (inventory) | none (inventory) | inference |" in md


@pytest.fixture
def broken_profiles(tmp_path: Path) -> Path:
    """A copy of profiles/ that also holds 'broken-lock': the old profile locked for Python >= 3.14, which
    the container's Python 3.11 cannot install (`uv sync --frozen` refuses it). The shipped profiles and
    the policy stay beside it: the policy's default must be one of the folder's profiles."""
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    dst = tmp_path / "profiles" / "broken-lock"
    shutil.copytree(REPO / "profiles" / OLD, dst)
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
        result: PlaybookRun = runner("upgrade.yml", CT, mlstack_upgrade_profile=NEW)
    finally:
        inside("mv /usr/bin/gcc.hidden /usr/bin/gcc")
    assert result.rc != 0
    # The new venv was built (the play says how long it took) and then refused by the doctor.
    assert re.search(r"mlstack-build-venv: built\s+\S+fla06\S*\s+in\s+[0-9.]+ s \(uv: ", result.output)
    assert "NO_C_COMPILER" in result.output
    assert active_venv() == before
    assert active_triton() == "3.6.0"
    # The container's doctor settings still name its active venv, not the refused candidate.
    settings = json.loads(inside("cat /etc/mlstack/doctor.json").stdout)
    assert settings["venv"] == "/opt/mlstack/venv", settings
    assert settings["lock"] == "/opt/mlstack/venv/uv.lock", settings


def test_upgrade_switches_when_the_doctor_passes(runner: Any) -> None:
    before = active_venv()
    result = runner("upgrade.yml", CT, mlstack_upgrade_profile=NEW)
    assert result.rc == 0, result.output[-4000:]
    assert (
        " ".join(result.output.split()).count(f"CT {VMID}: profile {NEW}, extras [], purpose inference") == 1
    )
    assert active_triton() == "3.7.1"
    assert active_fla() == "0.6.0"
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
    assert active_fla() == "0.5.1"
