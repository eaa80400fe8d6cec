"""A container's settings on day two: what the inventory states is compared (and only that), what is left
out keeps the container's value, a disk grows and never shrinks, and each change is placed where PVE
applies it (at once, or at the next start of a running container)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from ansible_collections.mlstack.pve.plugins.module_utils import ct_plan, ct_settings

ROOT = Path(__file__).resolve().parents[4]
NODE = {"name": "testbed", "tag": "mlstack", "bridge": "vmbr0", "features": ["nesting=1"]}
CURRENT = {
    "cores": "1",
    "memory": "2048",
    "swap": "0",
    "hostname": "t-200",
    "onboot": "1",
    "tags": "mlstack;owner-added",
    "net0": "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=dhcp,type=veth",
    "features": "nesting=1,keyctl=1",
    "rootfs": "local:200/vm-200-disk-0.raw,size=16G",
    "dev0": "/dev/nvidia0,gid=44,mode=0666",
}
DEVICES = {"dev0": "/dev/nvidia0,gid=44,mode=0666"}


def entry(**fields: Any) -> dict[str, Any]:
    return {"vmid": 200, "hostname": "t-200", **fields}


def test_what_the_entry_leaves_out_is_left_as_it_is() -> None:
    """No cores/memory_mb/disk_gb in the entry: the container's 1 core and 2 GiB are not 'the default'."""
    planned = ct_plan.reconcile(CURRENT, CURRENT, True, DEVICES, ct_settings.stated(entry(), NODE))
    assert planned["set"] == {} and planned["deleted"] == [] and planned["resize"] == ""


def test_a_property_list_and_tags_are_held_only_on_what_the_inventory_names() -> None:
    """A MAC address PVE chose, a feature and a tag added by hand are kept."""
    stated = ct_settings.stated(entry(tags=["day-two"]), {**NODE, "bridge": "vmbr1"})
    changes = ct_settings.setting_changes(CURRENT, stated)
    assert changes == {
        "tags": "day-two;mlstack;owner-added",
        "net0": "name=eth0,bridge=vmbr1,hwaddr=BC:24:11:00:00:01,ip=dhcp,type=veth",
    }


@pytest.mark.parametrize(
    ("fields", "name", "old", "new"),
    [
        ({"cores": 2}, "cores", "1", "2"),
        ({"memory_mb": 3072}, "memory_mb", "2048", "3072"),
        ({"swap_mb": 512}, "swap_mb", "0", "512"),
        ({"hostname": "t-200b"}, "hostname", "t-200", "t-200b"),
        ({"onboot": False}, "onboot", "1", "0"),
        ({"description": "day two"}, "description", None, "day two"),
    ],
)
def test_each_stated_setting_is_changed_live_on_a_running_container(
    fields: dict[str, Any], name: str, old: str | None, new: str
) -> None:
    planned = ct_plan.reconcile(CURRENT, CURRENT, True, DEVICES, ct_settings.stated(entry(**fields), NODE))
    assert planned["changes"] == {name: {"old": old, "new": new, "applies": ct_settings.LIVE}}
    assert planned["restart_needed"] == []


def test_features_and_a_changed_device_wait_for_the_next_start() -> None:
    node = {**NODE, "features": ["nesting=1", "fuse=1"]}
    options = {"dev0": "/dev/nvidia1,gid=44,mode=0666"}
    planned = ct_plan.reconcile(CURRENT, CURRENT, True, options, ct_settings.stated(entry(), node))
    assert {n: c["applies"] for n, c in planned["changes"].items()} == {
        "features (gpu_container_features)": ct_settings.RESTART,
        "dev0": ct_settings.RESTART,
    }
    assert planned["restart_needed"] == ["dev0", "features (gpu_container_features)"]


def test_a_stopped_container_takes_every_change_at_once() -> None:
    node = {**NODE, "features": ["fuse=1"]}
    planned = ct_plan.reconcile(CURRENT, CURRENT, False, {}, ct_settings.stated(entry(cores=2), node))
    assert {c["applies"] for c in planned["changes"].values()} == {ct_settings.LIVE}
    assert planned["restart_needed"] == []


def test_a_change_left_pending_is_not_made_again_and_still_needs_a_restart() -> None:
    """An earlier run set dev0 on the running container; PVE keeps it pending."""
    view = {**CURRENT, "dev0": "/dev/nvidia1,gid=44,mode=0666"}
    options = {"dev0": "/dev/nvidia1,gid=44,mode=0666"}
    planned = ct_plan.reconcile(CURRENT, view, True, options, ct_settings.stated(entry(), NODE))
    assert planned["set"] == {} and planned["restart_needed"] == ["dev0"]


@pytest.mark.parametrize(
    ("disk_gb", "resize", "refused"),
    [(None, "", False), (16, "", False), (24, "24G", False), (8, "", True)],
)
def test_a_disk_grows_and_is_never_shrunk(disk_gb: int | None, resize: str, refused: bool) -> None:
    grow, why = ct_settings.disk_change(CURRENT["rootfs"], disk_gb)
    assert grow == resize
    assert bool(why) is refused
    if refused:
        assert "disk_gb 8" in why and "(16 GiB)" in why


@pytest.mark.parametrize(
    ("fields", "bad"),
    [
        ({"cores": 0}, "cores"),
        ({"memory_mb": "lots"}, "memory_mb"),
        ({"swap_mb": -1}, "swap_mb"),
        ({"onboot": "yes"}, "onboot"),
        ({"tags": "a;b"}, "tags"),
        ({"description": "two\nlines"}, "description"),
    ],
)
def test_an_entry_pve_would_refuse_is_refused(fields: dict[str, Any], bad: str) -> None:
    (message,) = ct_settings.check_entry(entry(**fields))
    assert bad in message and "Container 200" in message


def test_a_new_container_gets_the_create_defaults() -> None:
    made = ct_settings.create_args(entry(), NODE, "torch211-triton37-fla06")
    sizes = (made["cores"], made["memory"], made["swap"], made["disk_gb"], made["onboot"])
    assert sizes == (2, 4096, 0, 32, True)
    assert made["description"] == "Managed by mlstack.pve: profile torch211-triton37-fla06"
    assert made["tags"] == ["mlstack"] and made["features"] == ["nesting=1"]


def test_the_spec_names_the_create_defaults() -> None:
    """The role's spec documents the create's defaults in words; they are the ones the create uses."""
    spec = yaml.safe_load((ROOT / "roles/gpu_container/meta/argument_specs.yml").read_text())
    fields = spec["argument_specs"]["main"]["options"]["gpu_container_list"]["options"]
    for key, value in ct_settings.CREATE_DEFAULTS.items():
        said = str(value).lower()
        assert "default" not in fields[key], key
        assert f"a new container: {said})" in fields[key]["description"], key
