"""The GPUs a container's `gpus` selects among the node's, read from nvidia-smi's recorded answers."""

from __future__ import annotations

from pathlib import Path

from ansible_collections.mlstack.pve.plugins.filter.node_gpus import gpus_of
from ansible_collections.mlstack.pve.plugins.module_utils.stack_policy import parse_nvidia_smi_csv

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


def test_nvidia_smi_gpus_reads_the_recorded_h200_answer() -> None:
    from ansible_collections.mlstack.pve.plugins.filter.node_gpus import nvidia_smi_gpus

    gpus = nvidia_smi_gpus((RECORDED / "h200.csv").read_text())
    assert len(gpus) == 8 and [g["index"] for g in gpus] == list(range(8))
    assert gpus[0] == {
        "index": 0,
        "name": "NVIDIA H200",
        "uuid": "GPU-eb71c47d-a861-7462-3963-1df8cd0f72b0",
        "compute_cap": "9.0",
    }


def test_gpus_of_a_malformed_selection_is_no_gpu() -> None:
    gpus = parse_nvidia_smi_csv((RECORDED / "h100-pcie.csv").read_text())
    assert gpus_of(gpus, "$(reboot)") == [] and gpus_of(gpus, ["0; reboot"]) == []
