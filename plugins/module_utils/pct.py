"""Reading and writing a PVE container's configuration through the `pct` CLI on the node.

PVE accepts devN and host-path mpN keys only from root@pam, and API tokens are refused for them,
so these keys are written with `pct set` on the node itself. Values are passed as argv, never
through a shell.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

PCT = "/usr/sbin/pct"
# Keys this project manages through pct: device passthrough and bind mount points, which are purged
# (one not wanted is removed), and the settings an inventory states, which are not.
MANAGED_KEY = re.compile(r"^(dev|mp)\d+$")
# The options O(options) may hold: devN/mpN, and the guest hookscript the project sets on a GPU container
# (root-only too, like devN), which is set but never purged (a container of the user's may have its own).
OPTION_KEY = re.compile(r"^((dev|mp)\d+|hookscript)$")
SETTING_KEY = re.compile(r"^(cores|memory|swap|hostname|onboot|description|tags|features|net0)$")


def parse_config(text: str) -> dict[str, str]:
    """Parse `pct config` output (current values only, up to the first snapshot or pending section)."""
    config: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("["):
            break
        key, sep, value = line.partition(":")
        if sep and key and not key.startswith("#"):
            config[key.strip()] = value.strip()
    return config


def parse_pending(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """Parse `pct pending` (`cur k: v`, `new k: v`, `del k: v` lines): (the config in effect, the config
    with the pending changes applied, which the container's next start runs with)."""
    current: dict[str, str] = {}
    view: dict[str, str] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        key, sep, value = rest.partition(":")
        if not sep or kind not in ("cur", "new", "del"):
            continue
        key, value = key.strip(), value.strip()
        if key == "description":
            value = unquote(value)
        if kind in ("cur", "del"):
            current[key] = value
        if kind == "cur":
            view.setdefault(key, value)
        elif kind == "new":
            view[key] = value
        else:
            view.pop(key, None)
    return current, view


def normalise(value: str) -> str:
    """A devN/mpN value in a canonical form, so `path=/dev/x,mode=0666` equals `/dev/x,mode=0666`."""
    parts = [p.strip() for p in str(value).split(",") if p.strip()]
    if parts and "=" in parts[0] and parts[0].split("=", 1)[0] in ("path", "mp", "volume"):
        parts[0] = parts[0].split("=", 1)[1]
    head, options = parts[0] if parts else "", sorted(parts[1:])
    return ",".join([head, *options])


def plan_changes(current: dict[str, str], desired: dict[str, str], purge: bool) -> tuple[dict, list]:
    """What to set and what to delete so the managed keys of `current` equal `desired`."""
    to_set = {k: v for k, v in desired.items() if normalise(current.get(k, "")) != normalise(v)}
    to_delete = []
    if purge:
        to_delete = sorted(k for k in current if MANAGED_KEY.match(k) and k not in desired)
    return to_set, to_delete


def set_command(vmid: int, to_set: dict[str, str], to_delete: list[str]) -> list[str]:
    """The argv of one `pct set` call applying a plan."""
    argv = [PCT, "set", str(vmid)]
    for key in sorted(to_set):
        argv += [f"--{key}", to_set[key]]
    if to_delete:
        argv += ["--delete", ",".join(to_delete)]
    return argv


def pending_command(vmid: int) -> list[str]:
    """The argv of `pct pending`: each key's value in effect and its pending value or delete."""
    return [PCT, "pending", str(vmid)]


def resize_command(vmid: int, size: str) -> list[str]:
    """The argv of `pct resize <vmid> rootfs <size>` (PVE grows the volume and its filesystem)."""
    return [PCT, "resize", str(vmid), "rootfs", size]


def reboot_command(vmid: int) -> list[str]:
    """The argv of `pct reboot`: a shutdown and a start, which applies the pending changes."""
    return [PCT, "reboot", str(vmid)]


def status_command(vmid: int) -> list[str]:
    """The argv of `pct status`, whose output is `status: running|stopped`."""
    return [PCT, "status", str(vmid)]


def start_command(vmid: int) -> list[str]:
    """The argv of `pct start`: on failure PVE prints its reason (the task log) on stderr."""
    return [PCT, "start", str(vmid)]


# PVE's reasons for refusing to start a container, most specific first, with what fixes each.
_START_FAILURES = (
    (
        re.compile(r"Device (/dev/\S+) does not exist"),
        "The node has no {0}, which the container passes through (devN). Check the NVIDIA driver on the "
        "node: `nvidia-smi` must list every GPU, and `nvidia-modprobe -u -c=0` recreates /dev/nvidia-uvm*. "
        "If the GPU is gone for good, list the GPUs left in the container's `gpus`. Then rerun "
        "provision.yml: its preflight checks every passed-through node first.",
    ),
    (
        re.compile(r"directory '([^']+)' does not exist"),
        "The bind-mount source {0} (mpN) is missing on the node: restore it or fix the container's "
        "model_path, then rerun provision.yml.",
    ),
    (
        re.compile(r"bridge '([^']+)' does not exist"),
        "The node has no bridge {0} for net0: fix mlstack_bridge in the inventory, then rerun.",
    ),
)


def explain_start_failure(text: str) -> str | None:
    """What to do about a failed `pct start`, from the most specific reason PVE printed; None if unknown."""
    for pattern, fix in _START_FAILURES:
        if m := pattern.search(text):
            return fix.format(*m.groups())
    return None
