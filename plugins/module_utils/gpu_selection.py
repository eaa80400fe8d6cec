"""A container's `gpus`, read one way everywhere: 'all' (the default), 'none', or a list of GPU indices.

Everything else is refused with what to write instead: a GPU listed twice, and above all a bare number
(`gpus: 0` reads as "GPU 0" to one person and "no GPU" to another: neither is guessed). The passthrough
(devN), the GPUs the stack policy sees, the node's preflight and the inventory check all take the selection
from here.
Standard library only.
"""

from __future__ import annotations

import re
from typing import Any

DEFAULT = "all"
GPU_NODE = re.compile(r"^/dev/nvidia(\d+)$")
# Only NVIDIA nodes are ever passed through.
NVIDIA_NODE = re.compile(r"^/dev/nvidia(\d+|ctl|-uvm|-uvm-tools|-modeset|-caps/nvidia-cap\d+)$")


class SelectionError(ValueError):
    """A `gpus` value that is not a selection, or that names GPUs the node lacks; the message says what
    to write instead."""


def indices(gpus: Any) -> list[int] | None:
    """The GPU indices `gpus` selects: None for every GPU ('all'), [] for none ('none', an empty list,
    false or null), else the listed indices in their order. SelectionError for anything else."""
    if gpus in (None, "none", []) or gpus is False:
        return []
    if gpus == "all":
        return None
    if isinstance(gpus, int) and not isinstance(gpus, bool):
        raise SelectionError(f"gpus: {gpus} is not a list: write [{gpus}] for GPU {gpus}, or none for no GPU")
    if not isinstance(gpus, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in gpus):
        raise SelectionError(f"gpus must be 'all', 'none' or a list of GPU indices, not {gpus!r}")
    # A GPU listed twice would be passed through once: the entry says something other than what it gets.
    twice = sorted({i for i in gpus if gpus.count(i) > 1})
    if twice:
        raise SelectionError(
            f"gpus {gpus} lists GPU {', '.join(map(str, twice))} more than once: list each GPU once"
        )
    return list(gpus)


def of_container(container: dict[str, Any]) -> list[int] | None:
    """indices() of an inventory entry's `gpus`, DEFAULT when it names none."""
    return indices(container.get("gpus", DEFAULT))


def requested(containers: list[dict[str, Any]]) -> bool:
    """Whether any of the containers asks for a GPU; SelectionError naming the first that is refused."""
    wanted = False
    for c in containers:
        try:
            wanted = of_container(c) != [] or wanted
        except SelectionError as e:
            raise SelectionError(f"Container {c.get('vmid', '?')}: {e}") from None
    return wanted


def _node_order(path: str) -> tuple[int, int, str]:
    m = GPU_NODE.match(path)
    return (0, int(m.group(1)), path) if m else (1, 0, path)


def select_nodes(nodes: list[str], gpus: Any) -> list[str]:
    """The device nodes `gpus` passes through: the chosen GPUs' plus the shared ones (nvidiactl, uvm,
    caps), GPUs first in index order. SelectionError for an index the node has no node for."""
    wanted = indices(gpus)
    nodes = sorted({n for n in nodes if NVIDIA_NODE.match(n)}, key=_node_order)
    if wanted == []:
        return []
    if wanted is None:
        return nodes
    present = {int(m.group(1)) for n in nodes if (m := GPU_NODE.match(n))}
    missing = sorted(set(wanted) - present)
    if missing:
        raise SelectionError(f"GPU index(es) {missing} not present on the node (has {sorted(present)})")
    return [n for n in nodes if not (m := GPU_NODE.match(n)) or int(m.group(1)) in wanted]


def select_gpus(gpus: list[dict[str, Any]], selection: Any) -> list[dict[str, Any]]:
    """The GPUs (nvidia-smi's rows, each with `index`) a container gets from `selection`, in their order.
    An index nvidia-smi did not list selects nothing (the device node check names it)."""
    wanted = indices(selection)
    if wanted is None:
        return list(gpus)
    return [g for g in gpus if int(g["index"]) in wanted]


def dropped_gpu_node(path: str, gpus: Any) -> bool:
    """Whether a passed-through device node is one `gpus` no longer selects (so this run removes it)."""
    wanted = indices(gpus)
    if wanted == []:
        return True
    m = GPU_NODE.match(path)
    return bool(m and wanted is not None and int(m.group(1)) not in wanted)
