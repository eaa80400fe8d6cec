"""A container's PVE settings from its inventory entry: what a create gives it, what an existing container
must match, and when PVE makes a change take effect.

One definition of each default (CREATE_DEFAULTS), used by the create only. An existing container is
compared on what the inventory states and nothing else: a key left out of its entry keeps the
container's value, whatever set it (the create's default, PVE, or a person). For the settings that are
lists of properties (net0, features, tags), what the inventory names must hold and the rest is kept: a
MAC address PVE chose, a feature or a tag added by hand.

When a change takes effect follows pve-container (LXC/Config.pm, vmconfig_hotplug_pending): a running
container takes cores, memory, swap, hostname, description, onboot, tags, network changes, a disk grown
with `pct resize` and a new devN/mpN at once; a changed or removed devN/mpN and features stay pending
until its next start. A stopped container takes everything at once.
"""

from __future__ import annotations

import re
from typing import Any

from ansible_collections.mlstack.pve.plugins.module_utils import ct_table
from ansible_collections.mlstack.pve.plugins.module_utils.ct_table import LIVE, RESTART

# What the create gives a container for a key its inventory entry leaves out (ct_table's defaults of a new
# container).
CREATE_DEFAULTS: dict[str, Any] = {s.key: s.default for s in ct_table.ENTRY.values() if s.new_only}
# The description a create writes when the entry states none ({profile}: the chosen stack profile).
CREATE_DESCRIPTION = "Managed by mlstack.pve: profile {profile}"
# Inventory key -> PVE key of the plain settings an entry may state: one value each, compared as it is (a
# disk's size, the tags and the passthrough entries are compared their own ways below).
ENTRY_KEYS = {
    s.key: s.pve
    for s in ct_table.ENTRY.values()
    if s.pve and s.applies == LIVE and s.type != "list" and s.pve != "rootfs"
}
# PVE key -> the inventory's name for it, in messages and the plan (a node's variable in brackets).
INVENTORY_NAME = {
    s.pve: s.key if s.where == "entry" else f"{s.pve} ({s.key})"
    for s in ct_table.SETTINGS
    if s.pve and not s.pve.endswith("N")
}
# Settings whose value is a property list (k=v,...): what the inventory names must hold, the rest stays.
PROPERTY_KEYS = frozenset({"net0", "features"})
# What a running container takes at once: the table's live settings, and PVE's other fast-plugged options
# (LXC_FASTPLUG_OPTIONS) that the inventory does not state.
HOT_KEYS = frozenset(
    {s.pve for s in ct_table.SETTINGS if s.applies == LIVE and s.pve and not s.pve.endswith("N")}
    - {"rootfs", "net0"}
    | {"cpulimit", "cpuunits"}
)
HOT_KEY = re.compile(r"^net\d+$")
# devN/mpN: hotplugged only when new; a changed or removed one waits for the next start.
PASSTHROUGH_KEY = re.compile(r"^(dev|mp)\d+$")

_SIZE = re.compile(r"^(\d+(?:\.\d+)?)([KMGT]?)$")
_UNITS = {"": 1 / 1024**3, "K": 1 / 1024**2, "M": 1 / 1024, "G": 1, "T": 1024}
# The settings PVE itself would refuse a value of (the others are checked before any role runs).
_PVE_SETTINGS = tuple(
    s for s in ct_table.ENTRY.values() if s.pve and not s.pve.endswith("N") and s.key != "vmid"
)


def pve_value(value: Any) -> str:
    """A value as PVE's config shows it: booleans 1/0, numbers and text as they are."""
    if isinstance(value, bool):
        return "1" if value else "0"
    return str(value).strip()


def split_props(value: str) -> dict[str, str]:
    """PVE's property string `k=v,k2=v2` as a dict (a bare first part under its own name)."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in str(value or "").split(",")):
        if part:
            k, sep, v = part.partition("=")
            out[k] = v if sep else ""
    return out


def join_props(props: dict[str, str]) -> str:
    return ",".join(f"{k}={v}" if v != "" else k for k, v in props.items())


def split_tags(value: str) -> list[str]:
    """PVE's tags, separated by ; , or spaces."""
    return [t for t in re.split(r"[;,\s]+", str(value or "")) if t]


def check_entry(entry: dict[str, Any]) -> list[str]:
    """What is wrong with the settings of one entry that PVE would refuse, as one message (or none)."""
    keys = [s for s in _PVE_SETTINGS if s.key in entry or s.key == "tags"]
    bad = [refused for s in keys if (refused := s.refusal(entry.get(s.key)))]
    if not bad:
        return []
    return [f"Container {entry.get('vmid', '?')}: expected {'; '.join(bad)}. Fix the inventory entry."]


def stated(entry: dict[str, Any], node: dict[str, Any]) -> dict[str, str]:
    """PVE key -> value of every setting the inventory states for an existing container: the entry's own
    keys, the project's tag with the entry's tags, net0's name and bridge, and the node's features."""
    out = {pve: pve_value(entry[key]) for key, pve in ENTRY_KEYS.items() if entry.get(key) is not None}
    out["tags"] = ";".join(dict.fromkeys([node["tag"], *map(str, entry.get("tags") or [])]))
    out["net0"] = join_props({"name": "eth0", "bridge": str(node["bridge"])})
    features = [str(f) for f in node.get("features") or []]
    if features:
        out["features"] = ",".join(features)
    return out


def create_args(entry: dict[str, Any], node: dict[str, Any], profile: str) -> dict[str, Any]:
    """What community.proxmox.proxmox creates the container with: the entry, else CREATE_DEFAULTS."""

    def get(key: str) -> Any:
        return entry[key] if entry.get(key) is not None else CREATE_DEFAULTS[key]

    made: dict[str, Any] = {
        s.create: (bool if s.type == "bool" else int)(get(s.key)) for s in ct_table.ENTRY.values() if s.create
    }
    return {
        **made,
        "description": str(entry.get("description") or CREATE_DESCRIPTION.format(profile=profile)),
        "tags": list(dict.fromkeys([str(node["tag"]), *map(str, entry.get("tags") or [])])),
        "net0": f"name=eth0,bridge={node['bridge']},ip=dhcp",
        "features": [str(f) for f in node.get("features") or []],
    }


def matches(key: str, current: str | None, desired: str) -> bool:
    """Whether the container's value holds what the inventory states for `key`."""
    if current is None:
        return False
    if key == "tags":
        return set(split_tags(desired)) <= set(split_tags(current))
    if key in PROPERTY_KEYS:
        have = split_props(current)
        return all(have.get(k) == v for k, v in split_props(desired).items())
    return str(current).strip() == desired.strip()


def merged(key: str, current: str | None, desired: str) -> str:
    """The value to set: the inventory's, keeping what it does not name of a property list or tags."""
    if current is None:
        return desired
    if key == "tags":
        return ";".join(sorted(set(split_tags(current)) | set(split_tags(desired))))
    if key in PROPERTY_KEYS:
        return join_props({**split_props(current), **split_props(desired)})
    return desired


def setting_changes(config: dict[str, Any], desired: dict[str, str]) -> dict[str, str]:
    """PVE key -> value to set, for each stated setting the config does not hold."""
    have = {str(k): pve_value(v) for k, v in config.items()}
    return {k: merged(k, have.get(k), v) for k, v in desired.items() if not matches(k, have.get(k), v)}


def disk_gib(rootfs: str | None) -> float | None:
    """The size of a rootfs value (`local:200/vm-200-disk-0.raw,size=16G`) in GiB; None if it has none."""
    size = split_props(rootfs or "").get("size")
    m = _SIZE.match(size or "")
    return float(m.group(1)) * _UNITS[m.group(2)] if m else None


def disk_change(rootfs: str | None, disk_gb: Any) -> tuple[str, str]:
    """(size to grow to, e.g. '24G', or '', refusal or ''): a root disk is grown, never shrunk (PVE
    cannot shrink one)."""
    if disk_gb is None:
        return "", ""
    have, want = disk_gib(rootfs), int(disk_gb)
    if have is None or abs(have - want) < 1 / 1024:
        return "", ""
    if want < have:
        return "", (
            f"disk_gb {want} is smaller than its root disk ({have:g} GiB): PVE cannot shrink a container's"
            f" disk. Set disk_gb to {have:g} or more, or move the data and recreate the container."
        )
    return f"{want}G", ""


def applies(key: str, running: bool, current: dict[str, Any], deleted: bool = False) -> str:
    """When PVE makes a change of `key` take effect: LIVE, or RESTART (pending until the next start)."""
    if not running:
        return LIVE
    if key in HOT_KEYS or HOT_KEY.match(key) or key == "rootfs":
        return LIVE
    if PASSTHROUGH_KEY.match(key) and key not in current and not deleted:
        return LIVE
    return RESTART


def pending_keys(current: dict[str, Any], pending_view: dict[str, Any], managed: set[str]) -> list[str]:
    """Managed keys whose value in PVE's pending view differs from the one in effect (a change that waits
    for the next start)."""
    keys = {k for k in set(current) | set(pending_view) if k in managed or PASSTHROUGH_KEY.match(k)}
    return sorted(k for k in keys if pve_value(current.get(k, "")) != pve_value(pending_view.get(k, "")))
