from __future__ import annotations

import pytest
from ansible_collections.mlstack.pve.plugins.module_utils import pct

CONFIG = """arch: amd64
cores: 2
dev0: /dev/nvidia0,gid=44,mode=0666
hostname: ml-100
mp0: /var/lib/mlstack/cache/uv,mp=/var/cache/mlstack/uv
tags: mlstack
[snapshot1]
dev0: /dev/old
"""


def test_parse_config_reads_current_values_only() -> None:
    config = pct.parse_config(CONFIG)
    assert config["dev0"] == "/dev/nvidia0,gid=44,mode=0666"
    assert config["hostname"] == "ml-100"
    assert "snapshot1" not in str(config)


@pytest.mark.parametrize(
    ("a", "b", "equal"),
    [
        ("path=/dev/nvidia0,mode=0666,gid=44", "/dev/nvidia0,gid=44,mode=0666", True),
        ("/host,mp=/ct,ro=1", "/host,ro=1,mp=/ct", True),
        ("/dev/nvidia0,gid=44", "/dev/nvidia1,gid=44", False),
        ("/host,mp=/ct", "/host,mp=/ct,ro=1", False),
    ],
)
def test_normalise_ignores_option_order_and_path_key(a: str, b: str, equal: bool) -> None:
    assert (pct.normalise(a) == pct.normalise(b)) is equal


def test_plan_sets_only_what_differs() -> None:
    current = pct.parse_config(CONFIG)
    desired = {"dev0": "path=/dev/nvidia0,mode=0666,gid=44", "dev1": "/dev/nvidiactl,gid=44,mode=0666"}
    to_set, to_delete = pct.plan_changes(current, desired, purge=True)
    assert to_set == {"dev1": "/dev/nvidiactl,gid=44,mode=0666"}
    assert to_delete == ["mp0"]


def test_plan_without_purge_keeps_unlisted_keys() -> None:
    _, to_delete = pct.plan_changes(pct.parse_config(CONFIG), {}, purge=False)
    assert to_delete == []


def test_set_command_is_argv_with_one_delete_list() -> None:
    argv = pct.set_command(100, {"dev1": "/dev/nvidiactl", "dev0": "/dev/nvidia0"}, ["mp1", "mp0"])
    assert argv == [
        "/usr/sbin/pct",
        "set",
        "100",
        "--dev0",
        "/dev/nvidia0",
        "--dev1",
        "/dev/nvidiactl",
        "--delete",
        "mp1,mp0",
    ]
