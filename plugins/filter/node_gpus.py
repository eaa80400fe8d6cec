"""The node's GPUs, as the stack policy takes them: nvidia-smi's answer parsed, and the ones a
container's `gpus` selects."""

from __future__ import annotations

from typing import Any

from ansible.errors import AnsibleFilterError
from ansible_collections.mlstack.pve.plugins.module_utils.stack_policy import parse_nvidia_smi_csv


def nvidia_smi_gpus(text: str) -> list[dict[str, Any]]:
    """`nvidia-smi --query-gpu=index,name,uuid,compute_cap --format=csv,noheader` as
    [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-...", "compute_cap": "9.0"}, ...]."""
    try:
        return parse_nvidia_smi_csv(str(text))
    except ValueError as e:
        raise AnsibleFilterError(str(e)) from e


def gpus_of(gpus: list[dict[str, Any]], selection: Any) -> list[dict[str, Any]]:
    """The GPUs a container gets from its `gpus` (all, none, or a list of indices)."""
    if selection in (None, "none", []) or selection is False:
        return []
    if selection == "all":
        return list(gpus)
    # Anything else than indices is left to the GPU selection check, which names what is wrong.
    items = selection if isinstance(selection, list) else [selection]
    wanted = {i for i in items if isinstance(i, int) and not isinstance(i, bool)}
    return [g for g in gpus if int(g["index"]) in wanted]


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"nvidia_smi_gpus": nvidia_smi_gpus, "gpus_of": gpus_of}
