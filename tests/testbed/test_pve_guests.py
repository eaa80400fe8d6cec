"""mlstack.pve.pve_guests against the testbed's API: every guest listed, and only the project's containers
and the inventory's vmids read further (config, and pending changes where they run)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlstack_testbed import client
from tbhelpers import LOCAL_INVENTORY, api_args, playbook, results, wait_ok

TAGGED, FOREIGN, NAMED = 931, 932, 933


def read(testbed: client.Testbed, env: dict[str, str], tmp: Path, **args: Any) -> dict[str, Any]:
    task = {
        "mlstack.pve.pve_guests": {**api_args(testbed), **args},
        "no_log": False,
        "ignore_errors": True,
    }
    plays = json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [task]}])
    (result,) = results(playbook(env, tmp, LOCAL_INVENTORY, plays), "localhost")
    return result


def test_reads_ours_and_the_named_and_lists_the_rest(
    api: Any,
    testbed: client.Testbed,
    ansible_env: dict[str, str],
    tmp_path: Path,
    cleanup: Any,
) -> None:
    lxc = api.nodes(testbed.node).lxc
    for vmid, extra in ((TAGGED, {"tags": "mlstack;team-a", "start": 1}), (FOREIGN, {}), (NAMED, {})):
        cleanup(vmid)
        wait_ok(
            api,
            testbed,
            lxc.post(
                vmid=vmid, ostemplate=testbed.template, storage=testbed.storage, unprivileged=1, **extra
            ),
        )
    # A change PVE keeps pending on a running container: it shows in `pending` only.
    lxc(TAGGED).config.put(features="nesting=1")

    out = read(testbed, ansible_env, tmp_path, tag="mlstack", vmids=[NAMED], pending=True)
    assert not out.get("failed"), out
    guests = {g["vmid"]: g for g in out["proxmox_vms"]}
    assert {TAGGED, FOREIGN, NAMED} <= set(guests), sorted(guests)
    assert guests[TAGGED]["status"] == "running" and guests[TAGGED]["type"] == "lxc"
    assert "mlstack" in guests[TAGGED]["config"]["tags"]
    assert "nesting=1" not in guests[TAGGED]["config"].get("features", "")
    assert "config" in guests[NAMED], "a vmid the inventory names is read whatever its tags"
    assert "config" not in guests[FOREIGN], "a guest neither ours nor named costs no config read"
    assert guests[FOREIGN]["name"] and guests[FOREIGN]["node"] == testbed.node
    assert TAGGED in out["ours"] and FOREIGN not in out["ours"] and NAMED not in out["ours"]
    pending = {g["vmid"]: g for g in out["pending"]}
    assert set(pending) & {TAGGED, FOREIGN, NAMED} == {TAGGED}, "only running containers have pending reads"
    assert "nesting=1" in pending[TAGGED]["config"]["features"]

    # The same read of the node alone, and of a node the cluster lacks.
    out = read(testbed, ansible_env, tmp_path, tag="mlstack", node=testbed.node)
    assert not out.get("failed"), out
    assert {g["node"] for g in out["proxmox_vms"]} == {testbed.node} and out["pending"] == []
    out = read(testbed, ansible_env, tmp_path, tag="mlstack", node="nosuchnode")
    assert out.get("failed") and "Node nosuchnode doesn't exist in PVE cluster" in out["msg"], out
