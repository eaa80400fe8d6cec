"""A shared folder removed or replaced on the node under running containers (CT 220, CT 221): the node's
read names each container that still has the old folder; a rerun stops naming the container, the folder
and the command, or, with mlstack_allow_restart, restarts only those containers, after which they have the
node's folder and the next rerun changes nothing. verify.yml names them and changes nothing.

The node plays only (--limit): the mounts are the node's and the containers' business, and nothing inside
is needed to see them. The caches are this file's own folders (pve_host_root and gpu_container's cache
paths), so removing them never touches the node's shared store that the other steps' containers bind."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playbook_runner import PlaybookRun, container, make_runner

ROOT = Path("/var/lib/mlstack/heal-test")
UV = ROOT / "cache" / "uv"
MODELS_221 = ROOT / "models-221"
CT_UV = "/var/cache/mlstack/uv"
EXTRA = {
    "pve_host_root": str(ROOT),
    "gpu_container_uv_cache_dir": str(UV),
    "gpu_container_triton_cache_dir": str(ROOT / "cache" / "triton"),
}
CTS = [container(220), container(221, model_path=str(MODELS_221))]


def said(run: PlaybookRun) -> str:
    return " ".join(run.output.split())


def init_pid(vmid: int) -> int:
    r = subprocess.run(["lxc-info", "-n", str(vmid), "-p", "-H"], capture_output=True, text=True, check=False)
    assert r.returncode == 0 and r.stdout.strip().isdigit(), (vmid, r.stdout, r.stderr)
    return int(r.stdout)


def identity_inside(vmid: int, path: str) -> tuple[int, int]:
    from tbhelpers import attach

    r = attach(vmid, f"stat -c '%d %i' {path}")
    assert r.returncode == 0, r.stderr
    dev, ino = r.stdout.split()
    return int(dev), int(ino)


def identity(path: Path) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_dev, st.st_ino


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, testbed: Any) -> Any:
    runner = make_runner(tmp_path_factory.mktemp("mount-heal"))

    def node_play(playbook: str = "provision.yml", **extra: Any) -> PlaybookRun:
        limit = testbed.node if playbook == "provision.yml" else None
        return runner(playbook, CTS, limit=limit, **{**EXTRA, **extra})

    return node_play


@pytest.fixture(scope="module")
def provisioned(run: Any) -> Iterator[None]:
    shutil.rmtree(ROOT, ignore_errors=True)
    MODELS_221.mkdir(parents=True)
    first = run()
    assert first.rc == 0, first.output[-4000:]
    yield
    gone = run("destroy.yml", mlstack_destroy_confirm=True)
    shutil.rmtree(ROOT, ignore_errors=True)
    assert gone.rc == 0, gone.output[-3000:]


def test_a_removed_uv_store_stops_the_rerun_naming_container_folder_and_command(
    provisioned: None, run: Any
) -> None:
    from tbhelpers import attach

    pids = {vmid: init_pid(vmid) for vmid in (220, 221)}
    shutil.rmtree(UV)
    # What every rerun then met inside: the container's store is the deleted folder.
    assert "No such file or directory" in attach(220, f"mkdir {CT_UV}/venvs").stderr

    again = run()
    text = said(again)
    assert again.rc != 0, text[-3000:]
    for vmid in (220, 221):
        assert f"CT {vmid}: {UV}, bound at {CT_UV}, was removed on the node while the container ran" in text
        assert f"`pct reboot {vmid}`" in text, text[-3000:]
    assert "-e mlstack_allow_restart=true" in text
    # The node's folder is made again; the containers were left running as they were.
    assert UV.is_dir()
    assert {vmid: init_pid(vmid) for vmid in (220, 221)} == pids
    assert identity_inside(220, CT_UV) != identity(UV)


def test_verify_names_it_and_changes_nothing(provisioned: None, run: Any) -> None:
    checked = run("verify.yml")
    text = said(checked)
    assert checked.rc != 0, text[-3000:]
    assert f"CT 220: {UV}, bound at {CT_UV}, was removed on the node while the container ran" in text
    assert "run `pct reboot 220` on testbed" in text and "The doctor was not run here" in text, text[-3000:]
    assert checked.changed() == 0, checked.changed_tasks()


def test_allowed_restarts_heal_and_the_next_rerun_changes_nothing(provisioned: None, run: Any) -> None:
    from tbhelpers import attach

    pids = {vmid: init_pid(vmid) for vmid in (220, 221)}
    healed = run(mlstack_allow_restart=True)
    assert healed.rc == 0, healed.output[-4000:]
    assert all(init_pid(vmid) != pid for vmid, pid in pids.items())
    for vmid in (220, 221):
        assert identity_inside(vmid, CT_UV) == identity(UV)
    made = attach(220, f"mkdir {CT_UV}/venvs-check && rmdir {CT_UV}/venvs-check")
    assert made.returncode == 0, made.stderr
    third = run()
    assert third.rc == 0 and third.changed() == 0, third.changed_tasks()


def test_a_replaced_model_folder_restarts_only_its_container(provisioned: None, run: Any) -> None:
    pids = {vmid: init_pid(vmid) for vmid in (220, 221)}
    MODELS_221.rename(ROOT / "models-221.old")
    MODELS_221.mkdir()
    healed = run(mlstack_allow_restart=True)
    assert healed.rc == 0, healed.output[-4000:]
    assert f"CT 221: {MODELS_221}, bound at /models, was replaced on the node" in said(healed)
    assert init_pid(221) != pids[221] and init_pid(220) == pids[220]
    assert identity_inside(221, "/models") == identity(MODELS_221)
