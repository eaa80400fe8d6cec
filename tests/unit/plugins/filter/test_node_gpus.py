"""The filters a play reads `gpus` with (gpus_of, gpus_requested): module_utils/gpu_selection.py's
reading, a refusal as the AnsibleFilterError a play shows."""

from __future__ import annotations

from pathlib import Path

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.mlstack.pve.plugins.filter.node_gpus import gpus_of, gpus_requested
from ansible_collections.mlstack.pve.plugins.module_utils.nvidia_facts import parse_nvidia_smi_csv

RECORDED = Path(__file__).resolve().parents[3] / "data" / "nvidia-smi"


def test_gpus_of_a_container() -> None:
    gpus = parse_nvidia_smi_csv((RECORDED / "mixed.csv").read_text())
    assert gpus_of(gpus, "all") == gpus
    assert gpus_of(gpus, "none") == [] and gpus_of(gpus, []) == []
    assert [(g["name"], g["compute_cap"]) for g in gpus_of(gpus, [2, 3])] == [
        ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "12.0"),
        ("NVIDIA L40S", "8.9"),
    ]


def test_gpus_of_an_index_the_node_did_not_list() -> None:
    gpus = parse_nvidia_smi_csv((RECORDED / "h100-pcie.csv").read_text())
    assert gpus_of(gpus, [1, 5]) == [gpus[1]]


@pytest.mark.parametrize("selection", ["$(reboot)", ["0; reboot"], 0])
def test_gpus_of_a_malformed_selection_is_refused(selection: object) -> None:
    gpus = parse_nvidia_smi_csv((RECORDED / "h100-pcie.csv").read_text())
    with pytest.raises(AnsibleFilterError, match="gpus"):
        gpus_of(gpus, selection)


def test_gpus_requested() -> None:
    assert gpus_requested([{"vmid": 1, "gpus": "none"}, {"vmid": 2}]) is True
    assert gpus_requested([{"vmid": 1, "gpus": "none"}]) is False
    with pytest.raises(
        AnsibleFilterError, match=r"^Container 2: gpus: 0 is not a list: write \[0\] for GPU 0"
    ):
        gpus_requested([{"vmid": 2, "gpus": 0}])
