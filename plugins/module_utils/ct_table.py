"""Every setting the inventory can state for a container, one row each: its key, PVE's key, its default,
what a value must be, when a change takes effect on a running container, and the privilege it needs.

The inventory check (unknown keys, values), the create's arguments and defaults, the day-two reconciliation
(ct_settings: which PVE keys are stated, which apply live), gpu_container's argument spec (a unit test holds
it to these rows) and docs/inventory.md's table (a unit test holds it too) all come from SETTINGS.

Rows with `where` "entry" are keys of a container's entry in mlstack_containers; rows with `where` "node" are
a node's variables that every container of the node follows. Standard library only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ansible_collections.mlstack.pve.plugins.module_utils import gpu_selection
from ansible_collections.mlstack.pve.plugins.module_utils.stack_facts import DEFAULT_PURPOSE, PURPOSES

# When a change of a setting takes effect on a running container (a stopped one takes every change at once).
LIVE = "live"
RESTART = "at the next start"
CREATE = "at the create only"
INSIDE = "inside the container, at the next provision run"

_HOSTNAME = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_FOLDER = re.compile(r"^[A-Za-z0-9._-]+$")
_MODEL_PATH = re.compile(r"^(/[A-Za-z0-9._/+-]*)?$")
_DOT_PART = re.compile(r"(^|/)\.\.?(/|$)")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
# A PVE tag: what the node tag and every container tag must be (inventory_check uses it too).
TAG = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
# What Ansible's `bool` type takes (ansible.module_utils.parsing.convert_bool), lower-cased.
_BOOLEANS = frozenset({"yes", "no", "on", "off", "true", "false", "1", "0", "y", "n", "t", "f", "1.0", "0.0"})


def whole(value: Any, least: int = 1, most: int | None = None) -> bool:
    """A whole number (or its digits) from `least` to `most`; never a boolean."""
    if isinstance(value, bool) or not str(value).strip().isdigit():
        return False
    n = int(str(value).strip())
    return n >= least and (most is None or n <= most)


def _hostname(v: Any) -> bool:
    return isinstance(v, str) and bool(_HOSTNAME.match(v))


def _folder(v: Any) -> bool:
    return v in (None, "") or (isinstance(v, str) and bool(_FOLDER.match(v)) and v not in (".", ".."))


def _model_path(v: Any) -> bool:
    path = "" if v is None else v
    return isinstance(path, str) and bool(_MODEL_PATH.match(path)) and not _DOT_PART.search(path)


def _names(pattern: re.Pattern[str]) -> Callable[[Any], bool]:
    return lambda v: v is None or (isinstance(v, list) and all(bool(pattern.match(str(e))) for e in v))


def _one_line(v: Any) -> bool:
    return v is None or (isinstance(v, (str, int, float)) and not re.search(r"[\x00-\x1f]", str(v)))


def _seq_lens(v: Any) -> bool:
    return all(whole(x) for x in v) and bool(v) if isinstance(v, list) else whole(v)


def _ansible_bool(v: Any) -> bool:
    return isinstance(v, bool) or str(v).strip().lower() in _BOOLEANS


def _gpus(v: Any) -> bool:
    try:
        gpu_selection.indices(v)
    except gpu_selection.SelectionError:
        return False
    return True


@dataclass(frozen=True)
class Setting:
    """One setting. `expect` completes "expected <key> ..." in a refusal; `valid` decides it."""

    key: str
    pve: str
    type: str
    meaning: str
    expect: str
    valid: Callable[[Any], bool]
    applies: str
    privilege: str
    default: Any = None
    # The default is what a new container gets; a key left out keeps an existing container's value.
    new_only: bool = False
    required: bool = False
    elements: str | None = None
    choices: tuple[str, ...] = ()
    # community.proxmox.proxmox's argument at the create ("": the create does not take it from the entry).
    create: str = ""
    where: str = "entry"
    # The words for a refused value, where they depend on it (else `expect`).
    explain: Callable[[Any], str] | None = None

    def refusal(self, value: Any) -> str | None:
        """None for a value this setting takes; else "<key> <what it must be>"."""
        if self.valid(value):
            return None
        return f"{self.key} {self.explain(value) if self.explain else self.expect}"


ROOT = "root@pam (pct set over SSH on the node)"
SETTINGS: tuple[Setting, ...] = (
    Setting("vmid", "vmid", "int", "Container ID, unique in the cluster.", "100..999999999",
            lambda v: whole(v, 100, 999999999), CREATE, "VM.Allocate", required=True),
    Setting("hostname", "hostname", "str", "Container hostname.", "a DNS label (a-z, 0-9, '-')", _hostname,
            LIVE, "VM.Config.Network", required=True),
    Setting("cores", "cores", "int", "CPU cores.", "a whole number above 0", whole, LIVE, "VM.Config.CPU",
            default=2, new_only=True, create="cores"),
    Setting("memory_mb", "memory", "int", "Memory in MiB.", "a whole number above 0", whole, LIVE,
            "VM.Config.Memory", default=4096, new_only=True, create="memory"),
    Setting("swap_mb", "swap", "int", "Swap in MiB.", "a whole number, 0 or more", lambda v: whole(v, 0),
            LIVE, "VM.Config.Memory", default=0, new_only=True, create="swap"),
    Setting("disk_gb", "rootfs", "int", "Root disk size in GiB; grown with pct resize, a smaller one is"
            " refused.", "a whole number above 0", whole, LIVE, "VM.Config.Disk, Datastore.AllocateSpace",
            default=32, new_only=True, create="disk_gb"),
    Setting("onboot", "onboot", "bool", "Start at the node's boot.", "true or false",
            lambda v: isinstance(v, bool), LIVE, "VM.Config.Options", default=True, new_only=True,
            create="onboot"),
    Setting("description", "description", "str", "The container's note in PVE (a new container: its"
            " profile).", "one line of text", _one_line, LIVE, "VM.Config.Options"),
    Setting("tags", "tags", "list", "Tags besides gpu_container_tag; tags added by hand are kept.",
            "a list of names of a-z, 0-9, . _ -", _names(TAG), LIVE, "VM.Config.Options", elements="str"),
    Setting("gpus", "devN", "raw", "all, none, or a list of GPU indices: the device nodes passed through"
            " (a new one at once where PVE hot-plugs it).",
            "all, none or a list of GPU indices", _gpus, RESTART, ROOT, default=gpu_selection.DEFAULT),
    Setting("profile", "", "str", "Stack profile (a folder under profiles/); unset: the stack policy"
            " chooses.", "a folder name (letters, digits, . _ -)", _folder, INSIDE, ""),
    Setting("model_path", "mpN", "str", "Host path of a model, bound read-only at /models.",
            "an absolute path of letters, digits and . _ / + - only (no '.' or '..' parts)", _model_path,
            RESTART, ROOT, default=""),
    Setting("extras", "", "list", "Extras of the profile to install, e.g. [tilelang]; unset: the stack policy"
            " derives them.", "names of letters, digits and . _ -", _names(_NAME), INSIDE, "", elements="str",
            explain=lambda v: "names of letters, digits and . _ -" if isinstance(v, list)
            else "a list of names"),
    Setting("purpose", "", "str", "What the container is for: training needs the backward to work.",
            " or ".join(PURPOSES), lambda v: v in PURPOSES, INSIDE, "", default=DEFAULT_PURPOSE,
            choices=PURPOSES),
    Setting("seq_len", "", "raw", "Training sequence length, or a list of them, the Triton cache is warmed"
            " for.", "a whole number above 0, or a list of them", _seq_lens, INSIDE, "", default=2048),
    Setting("batch_size", "", "int", "Training batch size the Triton cache is warmed for.",
            "a whole number above 0", whole, INSIDE, "", default=1),
    Setting("mlstack_monitor", "", "bool", "Scheduled doctor runs in this container (doctor_monitor); unset:"
            " the node's mlstack_monitor, default true.", "true or false", _ansible_bool, INSIDE, ""),
    # A node's variables that each of its containers follows.
    Setting("mlstack_bridge", "net0", "str", "The bridge of net0 (its MAC address is kept).",
            "an interface name", lambda v: True, LIVE, "VM.Config.Network", default="vmbr0", where="node"),
    Setting("gpu_container_features", "features", "list", "Container features (flags it does not list are"
            " kept).", "a list of k=v flags", lambda v: True, RESTART,
            "VM.Allocate (nesting), root@pam (others)", default=["nesting=1"], elements="str", where="node"),
    Setting("gpu_container_hookscript", "hookscript", "str", "Guest hookscript set on each container that"
            " passes GPUs through (gpu_boot's: it makes its NVIDIA nodes before a start); never removed.",
            "a volid storage:snippets/file", lambda v: True, LIVE, ROOT, default="", where="node"),
)  # fmt: skip
# The keys a container's entry may hold, in the table's order.
ENTRY = {s.key: s for s in SETTINGS if s.where == "entry"}
BY_PVE = {s.pve: s for s in SETTINGS if s.pve}
