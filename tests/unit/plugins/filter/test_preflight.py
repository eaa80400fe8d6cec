from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.mlstack.pve.plugins.filter import preflight as f
from ansible_collections.mlstack.pve.plugins.module_utils.preflight import path_within

ROOTS = ["/var/lib/mlstack", "/srv", "/mnt/"]


@pytest.mark.parametrize(
    ("path", "inside"),
    [
        ("/srv", True),
        ("/srv/models/qwen", True),
        ("/mnt/data", True),
        ("/var/lib/mlstack/cache/uv", True),
        ("/srv/../etc", False),
        ("/srvx/models", False),
        ("/etc", False),
        ("/", False),
        ("srv/models", False),
        ("", False),
    ],
)
def test_path_within(path: str, inside: bool) -> None:
    assert path_within(path, ROOTS) is inside


NODES = ["/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]


def guest(vmid: int, **devs: str) -> dict:
    return {"vmid": vmid, "type": "lxc", "config": {"hostname": "x", "mp0": "/srv,mp=/models", **devs}}


@pytest.mark.parametrize(
    ("gpus", "config", "driver", "missing"),
    [
        ("all", {"dev0": "/dev/nvidia0,gid=44", "dev1": "/dev/nvidia1,gid=44"}, False, ["/dev/nvidia1"]),
        ([0], {"dev0": "/dev/nvidia0", "dev1": "/dev/nvidia1"}, False, []),
        ("none", {"dev0": "/dev/nvidia1"}, False, []),
        (
            "all",
            {"dev0": "path=/dev/nvidia-caps/nvidia-cap1,mode=0666"},
            False,
            ["/dev/nvidia-caps/nvidia-cap1"],
        ),
        ("all", {"dev0": "/dev/nvidia-uvm"}, False, []),
        ("all", {"dev2": "/dev/nvidia-uvm-tools"}, True, []),
        ("all", {"dev0": "/dev/dri/card0"}, False, []),
    ],
)
def test_missing_passthrough(gpus: object, config: dict, driver: bool, missing: list[str]) -> None:
    nodes = [n for n in NODES if n != "/dev/nvidia-uvm-tools"]
    found = f.missing_passthrough([guest(160, **config)], [{"vmid": 160, "gpus": gpus}], nodes, driver)
    assert [m["path"] for m in found] == missing


def test_missing_passthrough_ignores_containers_not_in_the_inventory() -> None:
    assert f.missing_passthrough([guest(161, dev0="/dev/nvidia7")], [{"vmid": 160}], NODES) == []


def test_missing_passthrough_refuses_a_bare_index_as_every_reading_does() -> None:
    with pytest.raises(AnsibleFilterError, match=r"gpus: 0 is not a list: write \[0\] for GPU 0"):
        f.missing_passthrough([guest(160, dev0="/dev/nvidia1")], [{"vmid": 160, "gpus": 0}], NODES)
