"""mlstack.pve.ct_plan: which of create, configure and start a container needs, from guests as
mlstack.pve.pve_guests returns them (proxmox_vms, with their current configs). A wrong "nothing to do"
would leave a container unconfigured or stopped on a rerun, so each step is checked both ways."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ansible_collections.mlstack.pve.plugins.module_utils import ct_plan
from localplay import run_module

ROOT = Path(__file__).resolve().parents[4]
WANTED = {
    "dev0": "/dev/nvidia0,gid=44,mode=0666",
    "dev1": "/dev/nvidiactl,gid=44,mode=0666",
    "mp0": "/var/lib/mlstack/cache/uv,mp=/var/cache/mlstack/uv",
}


def guest(vmid: int = 195, status: str = "running", **config: str) -> dict[str, Any]:
    """A guest as pve_guests lists it; its config is WANTED unless given."""
    base = {"hostname": "ct195", "tags": "mlstack", "net0": "name=eth0,bridge=vmbr0,ip=dhcp", "digest": "x"}
    return {
        "vmid": vmid,
        "type": "lxc",
        "status": status,
        "node": "testbed",
        "config": {**base, **(config or WANTED)},
    }


def test_a_container_that_matches_and_runs_needs_nothing() -> None:
    plan = ct_plan.plan(guest(), WANTED)
    assert (plan["create"], plan["configure"], plan["start"]) == (False, False, False)


def test_a_container_not_read_needs_every_step() -> None:
    plan = ct_plan.plan(ct_plan.guest_of([guest(196)], 195), WANTED)
    assert (plan["create"], plan["configure"], plan["start"]) == (True, True, True)
    assert plan["set"] == WANTED


@pytest.mark.parametrize("status", ["stopped", "paused", ""])
def test_a_container_that_does_not_run_is_started(status: str) -> None:
    plan = ct_plan.plan(guest(status=status), WANTED)
    assert (plan["create"], plan["configure"], plan["start"]) == (False, False, True)


@pytest.mark.parametrize(
    ("config", "to_set", "deleted"),
    [
        # PVE's own spelling of the same value (path=, options in another order) is no difference.
        (
            {**WANTED, "dev0": "path=/dev/nvidia0,mode=0666,gid=44"},
            {},
            [],
        ),
        ({**WANTED, "dev0": "/dev/nvidia0,gid=44,mode=0660"}, {"dev0": WANTED["dev0"]}, []),
        ({k: v for k, v in WANTED.items() if k != "mp0"}, {"mp0": WANTED["mp0"]}, []),
        ({**WANTED, "dev2": "/dev/nvidia1,gid=44,mode=0666"}, {}, ["dev2"]),
    ],
)
def test_configuring_follows_the_devn_and_mpn_keys(
    config: dict[str, str], to_set: dict[str, str], deleted: list[str]
) -> None:
    plan = ct_plan.plan(guest(**config), WANTED)
    assert (plan["set"], plan["deleted"]) == (to_set, deleted)
    assert plan["configure"] is bool(to_set or deleted)
    assert plan["create"] is False


def test_a_guest_read_without_its_config_is_configured() -> None:
    bare = {"vmid": 195, "type": "lxc", "status": "running"}
    assert ct_plan.plan(bare, WANTED)["configure"] is True


def test_a_vm_with_the_vmid_is_not_the_container() -> None:
    vm = {**guest(), "type": "qemu"}
    assert ct_plan.guest_of([vm], 195) is None


def test_the_action_through_ansible() -> None:
    """The action as a play runs it: on the controller, the plan in the task's result."""
    args = {
        "guests": [guest(status="stopped", dev0="/dev/nvidia0,gid=44,mode=0666")],
        "vmid": "195",
        "options": WANTED,
    }
    result = run_module("mlstack.pve.ct_plan", args)
    assert result.get("failed") is not True, result
    assert result["changed"] is False
    assert (result["create"], result["configure"], result["start"]) == (False, True, True)
    assert result["set"] == {"dev1": WANTED["dev1"], "mp0": WANTED["mp0"]}
