"""mlstack.pve.pve_guests' own decisions that need no API: the project's tag is read from the config where
there is one. Its reads (a container removed since the listing left out, a refusal failing with the API's
words) run against the testbed's API code in tests/testbed/test_pve_guests.py."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.mlstack.pve.plugins.modules import pve_guests


@pytest.mark.parametrize(
    ("guest", "ours"),
    [
        ({"type": "lxc", "tags": "mlstack;team"}, True),
        ({"type": "lxc", "tags": "mlstack-old"}, False),
        ({"type": "qemu", "tags": "mlstack"}, False),
        # The config, where read, wins over the listing.
        ({"type": "lxc", "tags": "mlstack", "config": {"tags": "team"}}, False),
        ({"type": "lxc", "config": {"tags": "team;mlstack"}}, True),
        ({"type": "lxc"}, False),
    ],
)
def test_ours_by_tag(guest: dict[str, Any], ours: bool) -> None:
    assert pve_guests.carries(guest, "mlstack") is ours


def test_listed_as_proxmox_vm_info_lists_them() -> None:
    assert pve_guests.listed({"vmid": "120", "template": 0, "type": "lxc"}) == {
        "vmid": 120,
        "template": False,
        "type": "lxc",
    }
