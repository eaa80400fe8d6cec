"""Mistakes in the containers' entries: each is one line naming the entry and what to write instead, and a
run lists all of them (tests/provision/test_bad_input.py runs them through provision.yml)."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.mlstack.pve.plugins.module_utils import inventory_entries as entries
from localplay import run_module

NODES = ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]


def ct(vmid: int = 320, **fields: Any) -> dict[str, Any]:
    return {"vmid": vmid, "hostname": f"t-{vmid}", "cores": 1, "memory_mb": 2048, **fields}


MISTAKES = {
    "misspelt key": (
        [{"vmid": 320, "hostname": "t-320", "memroy_mb": 2048}],
        "Container 320 on pve1: memroy_mb: did you mean memory_mb?",
    ),
    "key with no close setting": (
        [ct(colour="blue")],
        "Container 320 on pve1: colour is no container setting (they are: vmid, hostname, cores,",
    ),
    "a node's variable in an entry": (
        [ct(mlstack_bridge="vmbr1")],
        "Container 320 on pve1: mlstack_bridge is a node's setting, not a container's: set it on the node.",
    ),
    "a string where a number goes": (
        [ct(cores="four")],
        "Container 320 on pve1: expected cores a whole number above 0 (not 'four'). Fix the inventory entry.",
    ),
    "a boolean where a number goes": (
        [ct(memory_mb=True)],
        "Container 320 on pve1: expected memory_mb a whole number above 0 (not True). Fix the inventory"
        " entry.",
    ),
    "a list where a string goes": (
        [ct(hostname=["a"])],
        "Container 320 on pve1: expected hostname a DNS label (a-z, 0-9, '-') (not ['a']). Fix the inventory"
        " entry.",
    ),
    "no hostname": (
        [{"vmid": 320}],
        "Container 320 on pve1: expected hostname a DNS label (a-z, 0-9, '-') (missing). Fix the inventory"
        " entry.",
    ),
    "no vmid": (
        [ct(321), {"hostname": "t-x"}],
        "Container #2 on pve1: expected vmid 100..999999999 (missing). Fix the inventory entry.",
    ),
    "seq_len list of words": (
        [ct(seq_len=["long"])],
        "Container 320 on pve1: expected seq_len a whole number above 0, or a list of them (not ['long']).",
    ),
    "GPU listed twice": (
        [ct(gpus=[0, 1, 0])],
        "Container 320 on pve1: gpus [0, 1, 0] lists GPU 0 more than once: list each GPU once. Fix the"
        " inventory entry.",
    ),
    "GPU the node lacks": (
        [ct(gpus=[7])],
        "Container 320 on pve1: GPU index(es) [7] not present on the node (has [0, 1]). Fix the inventory"
        " entry (or the node, where a GPU is missing from it).",
    ),
    "vmid twice on one node": (
        [ct(320), ct(320, hostname="t-320b")],
        "Container 320 (t-320) on pve1: vmid 320 is also the vmid of t-320b on pve1. Each container needs its"
        " own vmid.",
    ),
    "hostname twice on one node": (
        [ct(320), ct(321, hostname="t-320")],
        "Container 321 on pve1: hostname t-320 is also the hostname of Container 320 on pve1. Each container"
        " needs its own hostname.",
    ),
    "an entry that is no mapping": (
        [ct(320), "ml-321"],
        "Container #2 on pve1: expected a mapping of settings (vmid: ..., hostname: ...), not 'ml-321'.",
    ),
}


@pytest.mark.parametrize(("containers", "line"), list(MISTAKES.values()), ids=list(MISTAKES))
def test_each_mistake_is_one_line_naming_the_entry(containers: list[Any], line: str) -> None:
    found = entries.mistakes("pve1", containers, gpu_nodes=NODES)
    assert len([f for f in found if f.startswith(line)]) == 1, found
    assert all("\n" not in f for f in found)


def test_a_good_inventory_has_no_mistake() -> None:
    good = [ct(320, gpus=[0, 1], seq_len=[1024, 2048], tags=["a"], onboot=False), ct(321, gpus="none")]
    assert entries.mistakes("pve1", good, {"pve1": good, "pve2": [ct(322)]}, NODES) == []


def test_a_vmid_on_another_node_names_both() -> None:
    inventory = {"pve1": [ct(320)], "pve2": [ct(320, hostname="t-320b")]}
    assert entries.mistakes("pve2", inventory["pve2"], inventory) == [
        "Container 320 (t-320b) on pve2: vmid 320 is also the vmid of t-320 on pve1. Each container needs its"
        " own vmid."
    ]


def test_a_node_whose_list_is_left_empty_has_no_mistake() -> None:
    assert entries.mistakes("pve1", None) == []


def test_the_list_itself_must_be_a_list() -> None:
    assert entries.mistakes("pve1", {"vmid": 320}) == [
        "pve1: mlstack_containers must be a list of container entries (each with vmid, hostname, ...), not"
        " dict {'vmid': 320}. Fix the inventory."
    ]


def test_every_mistake_of_a_run_is_listed_entry_by_entry() -> None:
    containers = [ct(320, memroy_mb=1), ct(321, gpus=[0, 0]), ct(322, gpus=[7]), ct(323, cores="four")]
    found = entries.mistakes("pve1", containers, gpu_nodes=NODES)
    assert [line.split(":")[0] for line in found] == [f"Container {v} on pve1" for v in (320, 321, 322, 323)]


def test_the_action_reads_the_nodes_gpus_when_the_run_stops_anyway() -> None:
    """Through ansible, no gpu_nodes given: where there are mistakes and an entry lists GPU indices, the
    action reads the host's device nodes (this machine's: no /dev/nvidia7) to name a GPU it lacks too."""
    result = run_module(
        "mlstack.pve.inventory_check", {"checks": ["entries"], "containers": [ct(320, cores=0, gpus=[7])]}
    )
    assert result["failed"] is True
    assert result["errors"][0].startswith("Container 320 on localhost: expected cores a whole number above 0")
    assert result["errors"][1].startswith(
        "Container 320 on localhost: GPU index(es) [7] not present on the node"
    )


def test_the_action_passes_good_entries_without_reading_the_node() -> None:
    result = run_module(
        "mlstack.pve.inventory_check", {"checks": ["entries"], "containers": [ct(320, gpus=[7])]}
    )
    assert not result.get("failed") and result["errors"] == []
