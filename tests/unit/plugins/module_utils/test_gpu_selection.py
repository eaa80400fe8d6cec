"""A container's `gpus`, read one way (module_utils/gpu_selection.py): 'all', 'none' or a list of indices,
and every other value refused with what to write instead, `gpus: 0` above all. The device nodes, the
GPUs the stack policy sees, whether a node must have a driver, and the devN entries a run drops all take
their reading from here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ansible_collections.mlstack.pve.plugins.module_utils import gpu_selection as sel
from ansible_collections.mlstack.pve.plugins.module_utils.nvidia_facts import parse_nvidia_smi_csv

RECORDED = Path(__file__).resolve().parents[3] / "data" / "nvidia-smi"
NODES = ["/dev/nvidia1", "/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/sda"]


@pytest.mark.parametrize(
    ("gpus", "indices"),
    [("all", None), ("none", []), ([], []), (None, []), (False, []), ([1, 0], [1, 0])],
)
def test_a_selection_is_read(gpus: Any, indices: list[int] | None) -> None:
    assert sel.indices(gpus) == indices


@pytest.mark.parametrize(
    ("gpus", "said"),
    [
        (0, "gpus: 0 is not a list: write [0] for GPU 0, or none for no GPU"),
        (3, "gpus: 3 is not a list: write [3] for GPU 3, or none for no GPU"),
        ("some", "gpus must be 'all', 'none' or a list of GPU indices, not 'some'"),
        ("0,1", "gpus must be 'all', 'none' or a list of GPU indices, not '0,1'"),
        ([True], "gpus must be 'all', 'none' or a list of GPU indices, not [True]"),
        (["0"], "gpus must be 'all', 'none' or a list of GPU indices, not ['0']"),
        (True, "gpus must be 'all', 'none' or a list of GPU indices, not True"),
    ],
)
def test_anything_else_is_refused_saying_what_to_write(gpus: Any, said: str) -> None:
    with pytest.raises(sel.SelectionError) as refused:
        sel.indices(gpus)
    assert str(refused.value) == said


@pytest.mark.parametrize(
    ("gpus", "nodes"),
    [
        ("all", ["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-uvm", "/dev/nvidiactl"]),
        ([1], ["/dev/nvidia1", "/dev/nvidia-uvm", "/dev/nvidiactl"]),
        ("none", []),
    ],
)
def test_the_nodes_a_selection_passes_through(gpus: Any, nodes: list[str]) -> None:
    assert sel.select_nodes(NODES, gpus) == nodes


def test_an_index_without_a_node_is_refused() -> None:
    with pytest.raises(
        sel.SelectionError, match=r"GPU index\(es\) \[7\] not present on the node \(has \[0, 1\]\)"
    ):
        sel.select_nodes(NODES, [7])


def test_the_gpus_a_selection_gets_from_nvidia_smis_list() -> None:
    gpus = parse_nvidia_smi_csv((RECORDED / "mixed.csv").read_text())
    assert sel.select_gpus(gpus, "all") == gpus
    assert sel.select_gpus(gpus, "none") == []
    assert [g["index"] for g in sel.select_gpus(gpus, [3, 2])] == [2, 3]
    with pytest.raises(sel.SelectionError, match="write \\[0\\] for GPU 0"):
        sel.select_gpus(gpus, 0)


@pytest.mark.parametrize(
    ("containers", "wanted"),
    [
        ([{"vmid": 120}], True),  # no gpus: the default, every GPU
        ([{"vmid": 120, "gpus": "none"}, {"vmid": 121, "gpus": []}], False),
        ([{"vmid": 120, "gpus": "none"}, {"vmid": 121, "gpus": [0]}], True),
        ([], False),
    ],
)
def test_whether_a_node_must_have_gpus(containers: list[dict[str, Any]], wanted: bool) -> None:
    assert sel.requested(containers) is wanted


def test_a_bare_zero_is_not_no_gpu_for_the_node_either() -> None:
    with pytest.raises(sel.SelectionError) as refused:
        sel.requested([{"vmid": 120, "gpus": "none"}, {"vmid": 121, "gpus": 0}])
    assert (
        str(refused.value) == "Container 121: gpus: 0 is not a list: write [0] for GPU 0, or none for no GPU"
    )


@pytest.mark.parametrize(
    ("path", "gpus", "dropped"),
    [
        ("/dev/nvidia1", [0], True),
        ("/dev/nvidia0", [0], False),
        ("/dev/nvidiactl", [0], False),
        ("/dev/nvidiactl", "none", True),
        ("/dev/nvidia1", "all", False),
    ],
)
def test_the_nodes_a_run_drops(path: str, gpus: Any, dropped: bool) -> None:
    assert sel.dropped_gpu_node(path, gpus) is dropped
