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


PENDING = """cur cores: 2
cur description: Managed by mlstack.pve%3A profile x
cur dev0: /dev/nvidia0,gid=44,mode=0666
new dev0: /dev/nvidia1,gid=44,mode=0666
del dev1: /dev/nvidiactl,gid=44,mode=0666
new mp2: /srv/models,mp=/models,ro=1
"""


def test_parse_pending_gives_the_config_in_effect_and_the_next_starts() -> None:
    current, view = pct.parse_pending(PENDING)
    assert current == {
        "cores": "2",
        "description": "Managed by mlstack.pve: profile x",
        "dev0": "/dev/nvidia0,gid=44,mode=0666",
        "dev1": "/dev/nvidiactl,gid=44,mode=0666",
    }
    assert view == {
        "cores": "2",
        "description": "Managed by mlstack.pve: profile x",
        "dev0": "/dev/nvidia1,gid=44,mode=0666",
        "mp2": "/srv/models,mp=/models,ro=1",
    }


def test_the_testbeds_pct_pending_reads_back_as_it_was_written() -> None:
    """The testbed's `pct pending` prints PVE's format; the module's parser reads it back."""
    from mlstack_testbed.node.direct import format_pending

    items = [
        {"key": "cores", "value": 2},
        {"key": "description", "value": "Managed by mlstack.pve: profile x"},
        {"key": "dev0", "value": "/dev/nvidia0,gid=44,mode=0666", "pending": "/dev/nvidia1,gid=44,mode=0666"},
        {"key": "dev1", "value": "/dev/nvidiactl,gid=44,mode=0666", "delete": 1},
        {"key": "mp2", "pending": "/srv/models,mp=/models,ro=1"},
        {"key": "digest", "value": "abc"},
    ]
    assert "\n".join(format_pending(items)) + "\n" == PENDING


@pytest.mark.parametrize(
    ("settings", "refused"),
    [
        ({"tags": "day-two;mlstack", "description": "Managed by mlstack.pve: profile x"}, False),
        ({"net0": "name=eth0,bridge=vmbr0"}, False),
        ({"hostname": "a;reboot"}, True),
        ({"description": "two\nlines"}, True),
        ({"tags": "a b"}, True),
        ({"rootfs": "local:8"}, True),
    ],
)
def test_pct_config_passes_on_only_what_pve_formats_allow(settings: dict[str, str], refused: bool) -> None:
    from ansible_collections.mlstack.pve.plugins.modules.pct_config import refused_values

    assert bool(refused_values({"dev0": "/dev/nvidia0,gid=44,mode=0666"}, settings)) is refused
