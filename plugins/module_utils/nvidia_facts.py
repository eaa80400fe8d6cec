# Copied from verify/src/mlstack_doctor/facts/nvidia.py (the source; a unit test keeps both equal).
"""The NVIDIA driver as a node states it: the loaded kernel module's version and the GPUs nvidia-smi lists.

Standard library only (see the package's docstring): parsers of the text, never the reading itself.
"""

from __future__ import annotations

import re
from typing import Any

# Where the loaded kernel module states its version; absent when no NVIDIA module is loaded.
PROC_VERSION = "/proc/driver/nvidia/version"
# Its first line: "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 ..." or, of the
# open module, "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build ...".
KERNEL_MODULE = re.compile(r"Kernel Module(?:\s+for\s+\S+)?\s+([0-9]+(?:\.[0-9]+)+)")
# The one question asked of nvidia-smi about the GPUs, and the columns parse_nvidia_smi_csv reads.
NVIDIA_SMI_GPUS = ("nvidia-smi", "--query-gpu=index,name,uuid,compute_cap", "--format=csv,noheader")
_CAP = re.compile(r"^(\d+)\.(\d+)$")


def kernel_module_version(text: str) -> str | None:
    """The kernel module's version in the text of PROC_VERSION ("570.133.20"); None when it names none."""
    m = KERNEL_MODULE.search(text)
    return m.group(1) if m else None


def parse_nvidia_smi_csv(text: str) -> list[dict[str, Any]]:
    """GPUs from the answer to NVIDIA_SMI_GPUS, one line per GPU ("0, NVIDIA H200, GPU-..., 9.0"), as
    [{"index": 0, "name": "NVIDIA H200", "uuid": "GPU-...", "compute_cap": "9.0"}, ...].

    Lines that are not a GPU row (a warning nvidia-smi printed among them) are skipped.
    """
    gpus = []
    for line in text.splitlines():
        index, _, rest = line.partition(",")
        fields = rest.rsplit(",", 2)  # a name could hold a comma; the uuid and compute_cap cannot
        if len(fields) != 3 or not index.strip().isdigit() or not _CAP.match(fields[2].strip()):
            continue
        name, uuid, cap = (f.strip() for f in fields)
        gpus.append({"index": int(index), "name": name, "uuid": uuid, "compute_cap": cap})
    return gpus
