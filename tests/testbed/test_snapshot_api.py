"""PVE snapshots on the testbed's btrfs storage (local-btrfs): a snapshot is a real copy of the container's
rootfs, a rollback puts it back and starts the real container, a delete or a destroy removes the copies,
and a restarted API still lists them. Asked of an API of this checkout's code on a port of its own
(tbhelpers.OwnApi) with its own state dir, so the shared server keeps running; its one container, CT 263,
is real (the machine's LXC) and removed at the end."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlstack_testbed import client, paths
from mlstack_testbed.lxc import realct
from mlstack_testbed.node import backend
from tbhelpers import OwnApi, attach

VMID = 263
NODE = paths.FIRST_NODE


def done(api: Any, upid: str) -> dict[str, Any]:
    status = client.wait_task(api, NODE, upid, 300)
    assert status["exitstatus"] == "OK", client.task_log(api, NODE, upid)
    return status


def marker() -> str:
    r = attach(VMID, "cat /root/snapshot-marker")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory, testbed: client.Testbed) -> Iterator[tuple[OwnApi, Any]]:
    """The own API with CT 263 created on local-btrfs and running, a marker file written inside."""
    assert not realct.ct_dir(VMID).exists(), f"CT {VMID} is left over on this machine: remove it first"
    served = OwnApi(tmp_path_factory.mktemp("snapshot-api"))
    api = served.proxmox()
    try:
        done(
            api,
            api.nodes(NODE).lxc.post(
                vmid=VMID,
                ostemplate=testbed.template,
                hostname=f"snap-{VMID}",
                storage=backend.SNAPSHOT_STORAGE,
                unprivileged=1,
                start=1,
            ),
        )
        assert attach(VMID, "echo before > /root/snapshot-marker").returncode == 0
        yield served, api
    finally:
        try:
            if realct.state(VMID)[0] != "missing":
                done(api, api.nodes(NODE).lxc(VMID).delete(force=1, purge=1))
        finally:
            served.stop()
            realct.destroy(VMID)


def test_a_snapshot_is_a_real_copy_of_the_rootfs(own: tuple[OwnApi, Any]) -> None:
    served, api = own
    done(api, api.nodes(NODE).lxc(VMID).snapshot.post(snapname="first", description="kept for the test"))
    copy = served.pve.snapshot_copy(VMID, "first") / "rootfs"
    assert (copy / "root" / "snapshot-marker").read_text() == "before\n"
    # An unprivileged container's files keep their shifted owners in the copy.
    assert os.stat(copy / "etc" / "passwd").st_uid == realct.IDMAP.host_base
    listed = {s["name"]: s for s in api.nodes(NODE).lxc(VMID).snapshot.get()}
    assert listed["first"]["description"] == "kept for the test"
    assert realct.state(VMID)[0] == "running"


def test_a_rollback_puts_the_copy_back_and_starts_the_container(own: tuple[OwnApi, Any]) -> None:
    _, api = own
    assert attach(VMID, "echo after > /root/snapshot-marker").returncode == 0
    done(api, api.nodes(NODE).lxc(VMID).snapshot("first").rollback.post(start=1))
    assert realct.state(VMID)[0] == "running"
    assert api.nodes(NODE).lxc(VMID).status.current.get()["status"] == "running"
    assert marker() == "before"
    assert "lxc.rootfs.path = dir:" in (realct.ct_dir(VMID) / "config").read_text()


def test_snapshots_outlive_a_restart_of_the_api(own: tuple[OwnApi, Any], tmp_path: Path) -> None:
    served, _ = own
    again = backend.TestbedPve(
        password="x",
        port=0,
        state_file=served.pve.state_file,
        access_file=tmp_path / "access.json",
        tokens_dir=tmp_path / "tokens",
    )
    again.load()
    assert set(again.ct(VMID).snapshots) == {"first"}
    assert again.ct(VMID).snapshots["first"]["description"] == "kept for the test"


def test_a_rollback_to_a_missing_snapshot_changes_nothing(own: tuple[OwnApi, Any]) -> None:
    _, api = own
    done(api, api.nodes(NODE).lxc(VMID).snapshot.post(snapname="second"))
    upid = api.nodes(NODE).lxc(VMID).snapshot("nope").rollback.post(start=1)
    status = client.wait_task(api, NODE, upid, 60)
    assert status["exitstatus"] == "snapshot 'nope' does not exist"
    assert realct.state(VMID)[0] == "running"
    assert marker() == "before"


def test_a_delete_and_a_destroy_remove_the_copies(own: tuple[OwnApi, Any]) -> None:
    served, api = own
    done(api, api.nodes(NODE).lxc(VMID).snapshot("first").delete())
    assert not served.pve.snapshot_copy(VMID, "first").exists()
    assert served.pve.snapshot_copy(VMID, "second").is_dir()
    done(api, api.nodes(NODE).lxc(VMID).status.stop.post())
    done(api, api.nodes(NODE).lxc(VMID).delete(purge=1))
    assert not (served.pve.snapshot_dir / str(VMID)).exists()
    assert not realct.exists(VMID)
