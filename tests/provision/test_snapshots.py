"""PVE snapshots around an upgrade, on one real testbed container (CT 260, on the testbed's btrfs storage
local-btrfs): upgrade.yml -e mlstack_upgrade_snapshot=true snapshots it before its venv changes, a broken
stack is put back by rollback.yml -e mlstack_rollback_to_snapshot=true with the doctor green, and the
project's snapshots are listed and pruned, anyone else's left alone. CT 261, on the dir storage 'local'
and never provisioned (created bare through the API), shows the refusal of a storage that cannot
snapshot, before any change. Both are removed at the end."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from ansible_collections.mlstack.pve.plugins.module_utils import snapshots
from playbook_runner import DEFAULT_PROFILE, PlaybookRun, container, make_runner, vars_of_testbed_token

VMID = 260
DIR_CT = 261
STORAGE = "local-btrfs"
OLD = "torch211-triton36"
NEW = DEFAULT_PROFILE
CT = [container(VMID, profile=OLD, extras=[], purpose="inference")]
STORE = Path("/var/lib/mlstack/cache/uv/venvs")
# The round trip's times, printed when the module's container goes (pytest -s shows them).
TIMES: dict[str, float] = {}


def inside(vmid: int, script: str) -> subprocess.CompletedProcess[str]:
    """A command in the real container, straight through lxc-attach (not through the project)."""
    from tbhelpers import attach

    return attach(vmid, script, timeout=120)


def active_venv() -> str:
    return inside(VMID, "readlink /opt/mlstack/venv").stdout.strip()


def said(result: PlaybookRun) -> str:
    return " ".join(result.output.split())


def listed(api: Any, testbed: Any, vmid: int = VMID) -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in api.nodes(testbed.node).lxc(vmid).snapshot.get() if s["name"] != "current"}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory, testbed: Any) -> Iterator[Any]:
    api = testbed.proxmox()
    storages = {s["storage"] for s in api.nodes(testbed.node).storage.get()}
    assert STORAGE in storages, f"the testbed API has no storage {STORAGE}: restart it (make testbed)"
    runner = make_runner(tmp_path_factory.mktemp("snapshots"))
    try:
        yield runner
    finally:
        runner("destroy.yml", CT, mlstack_destroy_confirm=True, mlstack_rootfs_storage=STORAGE)
        print(f"\nsnapshot round trip on CT {VMID}:", ", ".join(f"{k} {v:.0f} s" for k, v in TIMES.items()))


@pytest.fixture(scope="module")
def provisioned(run: Any) -> Any:
    t0 = time.monotonic()
    first = run("provision.yml", CT, mlstack_rootfs_storage=STORAGE)
    TIMES["provision"] = time.monotonic() - t0
    assert first.rc == 0, first.output[-4000:]
    return run


@pytest.fixture(scope="module")
def upgraded(provisioned: Any) -> tuple[PlaybookRun, str]:
    """upgrade.yml with a snapshot, from OLD to NEW; the venv it left."""
    left = active_venv()
    t0 = time.monotonic()
    result = provisioned("upgrade.yml", CT, mlstack_upgrade_profile=NEW, mlstack_upgrade_snapshot=True)
    TIMES["upgrade with a snapshot"] = time.monotonic() - t0
    assert result.rc == 0, result.output[-4000:]
    return result, left


def test_the_upgrade_snapshots_the_profile_it_leaves(
    upgraded: tuple[PlaybookRun, str], api: Any, testbed: Any
) -> None:
    result, left = upgraded
    assert Path(left).name.startswith(OLD + "-")
    ours = [s for s in listed(api, testbed).values() if s["name"].startswith(f"mlstack-{OLD}-")]
    assert len(ours) == 1, listed(api, testbed)
    snap = ours[0]
    assert snapshots.VALID_NAME.match(snap["name"])
    assert f"venv {Path(left).name}, taken " in snap["description"]
    assert f"CT {VMID}: snapshot {snap['name']} taken" in said(result)
    # The upgrade went on: the new venv is active.
    assert Path(active_venv()).name.startswith(NEW + "-")


def test_a_check_mode_rollback_changes_nothing(
    upgraded: tuple[PlaybookRun, str], run: Any, testbed: Any
) -> None:
    before = active_venv()
    result = run(
        "rollback.yml", CT, limit=testbed.node, flags=("--check",), mlstack_rollback_to_snapshot=True
    )
    assert result.rc == 0, result.output[-4000:]
    assert f"CT {VMID}: would go back to snapshot mlstack-{OLD}-" in said(result)
    assert active_venv() == before


def test_a_rollback_to_the_snapshot_repairs_a_broken_stack(
    upgraded: tuple[PlaybookRun, str], run: Any, api: Any, testbed: Any
) -> None:
    _, left = upgraded
    # Broken twice over: no C compiler and no active venv.
    assert inside(VMID, "rm /usr/bin/gcc /opt/mlstack/venv").returncode == 0
    t0 = time.monotonic()
    # With the testbed's least-privilege token (the docs' role): VM.Snapshot.Rollback is enough.
    result = run(
        "rollback.yml", CT, mlstack_rollback_to_snapshot=True, **vars_of_testbed_token(testbed.state_dir)
    )
    TIMES["rollback to the snapshot (doctor included)"] = time.monotonic() - t0
    # rc 0: the doctor passed on the restored stack.
    assert result.rc == 0, result.output[-4000:]
    assert f"CT {VMID}: went back to snapshot mlstack-{OLD}-" in said(result)
    assert active_venv() == left
    assert inside(VMID, "test -x /usr/bin/gcc").returncode == 0
    r = inside(VMID, "/opt/mlstack/venv/bin/python -c 'import triton; print(triton.__version__)'")
    assert r.stdout.strip() == "3.6.0", r.stderr
    assert api.nodes(testbed.node).lxc(VMID).status.current.get()["status"] == "running"


def test_a_snapshot_whose_venv_is_gone_is_refused(
    upgraded: tuple[PlaybookRun, str], run: Any, api: Any, testbed: Any
) -> None:
    when = datetime.now(UTC) - timedelta(days=3)
    gone = "torch211-pruned-0123456789ab"
    name = snapshots.snapshot_name(gone, when)
    ct = api.nodes(testbed.node).lxc(VMID)
    from tbhelpers import wait_ok

    wait_ok(api, testbed, ct.snapshot.post(snapname=name, description=snapshots.description(gone, when)))
    before = active_venv()
    result = run(
        "rollback.yml",
        CT,
        limit=testbed.node,
        mlstack_rollback_to_snapshot=True,
        mlstack_rollback_snapshot=name,
    )
    assert result.rc != 0
    text = said(result)
    assert f"venv {gone}, which is no longer in the node's uv store" in text, text[-3000:]
    assert "Nothing was changed." in text
    assert active_venv() == before


def test_the_projects_snapshots_are_pruned_and_no_one_elses(
    upgraded: tuple[PlaybookRun, str], run: Any, api: Any, testbed: Any
) -> None:
    from tbhelpers import wait_ok

    ct = api.nodes(testbed.node).lxc(VMID)
    older = f"{OLD}-0123456789ab"
    when = datetime.now(UTC) - timedelta(days=9)
    name = snapshots.snapshot_name(older, when)
    wait_ok(api, testbed, ct.snapshot.post(snapname=name, description=snapshots.description(older, when)))
    for other, description in (("before-my-change", "by hand"), ("mlstack-by-hand", "by hand too")):
        wait_ok(api, testbed, ct.snapshot.post(snapname=other, description=description))
    ours_before = snapshots.ours(list(listed(api, testbed).values()))
    assert len(ours_before) >= 2
    # The node plays only: a snapshot and the prune, no venv built.
    result = run(
        "upgrade.yml",
        CT,
        limit=testbed.node,
        mlstack_upgrade_profile=NEW,
        mlstack_upgrade_snapshot=True,
        mlstack_snapshot_keep=2,
        # The docs' role: VM.Snapshot takes and removes them.
        **vars_of_testbed_token(testbed.state_dir),
    )
    assert result.rc == 0, result.output[-4000:]
    after = listed(api, testbed)
    kept = snapshots.ours(list(after.values()))
    # The newest two by PVE's snaptime: the one just taken and the newest before it.
    assert [s["name"] for s in kept][1:] == [ours_before[0]["name"]], (kept, ours_before)
    assert kept[0]["snaptime"] >= ours_before[0]["snaptime"] and kept[0]["name"] not in {
        s["name"] for s in ours_before
    }
    assert {"before-my-change", "mlstack-by-hand"} <= set(after)
    removed = {s["name"] for s in ours_before[1:]}
    assert removed and not removed & set(after)
    tail = said(result).split("removed: ", 1)[-1]
    assert all(name in tail for name in removed), said(result)[-3000:]


@pytest.fixture
def dir_ct(api: Any, testbed: Any) -> Iterator[int]:
    """CT 261 on the dir storage 'local', tagged as ours and running, never provisioned."""
    from tbhelpers import remove_ct, wait_ok

    remove_ct(api, testbed, DIR_CT)
    upid = api.nodes(testbed.node).lxc.post(
        vmid=DIR_CT,
        ostemplate=testbed.template,
        hostname=f"t-{DIR_CT}",
        storage="local",
        unprivileged=1,
        tags="mlstack",
        start=1,
    )
    wait_ok(api, testbed, upid)
    yield DIR_CT
    remove_ct(api, testbed, DIR_CT)


def test_a_storage_that_cannot_snapshot_is_refused_before_any_change(
    dir_ct: int, run_playbook: Any, api: Any, testbed: Any
) -> None:
    entry = [container(dir_ct, profile=NEW)]
    result = run_playbook("upgrade.yml", entry, mlstack_upgrade_profile=NEW, mlstack_upgrade_snapshot=True)
    assert result.rc != 0
    text = said(result)
    assert f"PVE refused to snapshot CT {dir_ct} as mlstack-none-" in text, text[-3000:]
    assert "snapshot feature is not available" in text
    assert "zfspool, lvmthin, btrfs or rbd" in text
    # Nothing of the upgrade ran: no venv in the store, nothing under /opt/mlstack, no snapshot.
    assert not (STORE / f"ct{dir_ct}").exists()
    assert inside(dir_ct, "test -e /opt/mlstack").returncode != 0
    assert listed(api, testbed, dir_ct) == {}
