"""mlstack.pve.pve_guests' own decisions, with the API stubbed (tests/testbed/test_pve_guests.py runs it
against the testbed's API): a container removed since the listing is left out, a refusal fails with the
client's words, and the project's tag is read from the config where there is one."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.mlstack.pve.plugins.modules import pve_guests


class Failed(Exception):
    pass


class Module:
    def fail_json(self, **kwargs: Any) -> None:
        raise Failed(kwargs["msg"])


class Api:
    """nodes(node).lxc(vmid).config.get(current=...) answering with `answer` (an exception is raised)."""

    def __init__(self, answer: Any) -> None:
        self.answer = answer
        self.config = self

    def nodes(self, node: str) -> Api:
        return self

    def lxc(self, vmid: int) -> Api:
        return self

    def get(self, current: int) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return {**self.answer, "current": current}


def reader(answer: Any) -> pve_guests.Guests:
    guests = pve_guests.Guests.__new__(pve_guests.Guests)  # no login: the API is the stub
    guests.module, guests.proxmox_api = Module(), Api(answer)
    return guests


GUEST = {"vmid": 120, "node": "pve1", "type": "lxc"}


def test_a_config_gone_since_the_listing_is_left_out() -> None:
    gone = Exception("500 Internal Server Error: Configuration file 'nodes/pve1/lxc/120.conf' does not exist")
    assert reader(gone).config(GUEST, 1) is None


def test_a_refusal_fails_with_the_clients_words() -> None:
    refused = Exception("403 Forbidden: Permission check failed (/vms/120, VM.Audit)")
    with pytest.raises(
        Failed, match=r"pending changes of CT 120 on node pve1: 403 Forbidden: Permission check"
    ):
        reader(refused).config(GUEST, 0)


def test_the_config_is_read_as_asked() -> None:
    assert reader({"tags": "mlstack"}).config(GUEST, 0) == {"tags": "mlstack", "current": 0}


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
