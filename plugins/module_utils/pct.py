"""Reading and writing a PVE container's configuration through the `pct` CLI on the node.

PVE accepts devN and host-path mpN keys only from root@pam, and API tokens are refused for them,
so these keys are written with `pct set` on the node itself. Values are passed as argv, never
through a shell.
"""

from __future__ import annotations

import re

PCT = "/usr/sbin/pct"
# Keys this project manages through pct: device passthrough and bind mount points.
MANAGED_KEY = re.compile(r"^(dev|mp)\d+$")


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
