"""The project's PVE snapshots of a container: their names, how they are told apart from anyone else's,
which ones a prune removes, and what PVE's refusal of one means.

A snapshot is ours when its name has NAME_PREFIX and its description starts with MARKER; the description
carries the venv (the full profile key) the container ran and the UTC time it was taken, so that a
rollback can check the venv is still in the node's uv store before it changes anything.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

NAME_PREFIX = "mlstack-"
MARKER = "mlstack upgrade snapshot"
# PVE's snapshot names (pve-configid): a letter first, then letters, digits, '-' and '_'; 40 at most.
MAX_NAME = 40
VALID_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,39}$")
TIME_FORMAT = "%Y%m%d%H%M"
# A venv's id is its profile and 12 hex digits of its lock's hash (ml_venv's _ml_venv_id).
VENV_ID = re.compile(r"^(?P<profile>.+)-[0-9a-f]{12}$")
# What the container ran when it had no active venv.
NO_VENV = "none"
DESCRIPTION = re.compile(re.escape(MARKER) + r": venv (?P<venv>\S+), taken (?P<taken>\S+)")
# PVE's words when a volume's storage cannot snapshot (PVE::LXC::Config->snapshot_prepare).
NOT_AVAILABLE = "snapshot feature is not available"


def profile_of(venv_id: str) -> str:
    """The profile a venv id was built from: the id less its hash (the id itself when it has none)."""
    found = VENV_ID.match(venv_id)
    return found.group("profile") if found else venv_id


def snapshot_name(venv_id: str, now: datetime) -> str:
    """mlstack-<profile>-<UTC yyyymmddHHMM>: the profile trimmed and cleaned to fit PVE's 40 characters."""
    stamp = now.astimezone(UTC).strftime(TIME_FORMAT)
    profile = re.sub(r"[^A-Za-z0-9_-]+", "-", profile_of(venv_id) or NO_VENV)
    room = MAX_NAME - len(NAME_PREFIX) - 1 - len(stamp)
    profile = profile[:room].strip("-_") or NO_VENV
    return f"{NAME_PREFIX}{profile}-{stamp}"


def description(venv_id: str, now: datetime) -> str:
    taken = now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{MARKER}: venv {venv_id or NO_VENV}, taken {taken}"


def _marked(snap: Mapping[str, Any]) -> re.Match[str] | None:
    """The description's marker line, when the snapshot is ours: by the name prefix AND the description
    (a snapshot someone named mlstack-* by hand is not ours)."""
    if not str(snap.get("name", "")).startswith(NAME_PREFIX):
        return None
    return DESCRIPTION.match(str(snap.get("description") or "").strip())


def is_ours(snap: Mapping[str, Any]) -> bool:
    return _marked(snap) is not None


def ours(snapshots: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The project's snapshots, newest first, each {name, snaptime, description, venv, taken}."""
    out = []
    for snap in snapshots:
        found = _marked(snap)
        if found is None:
            continue
        venv = found.group("venv")
        out.append(
            {
                "name": str(snap["name"]),
                "snaptime": int(snap.get("snaptime") or 0),
                "description": str(snap.get("description") or "").strip(),
                "venv": "" if venv == NO_VENV else venv,
                "taken": found.group("taken"),
            }
        )
    return sorted(out, key=lambda s: (s["snaptime"], s["name"]), reverse=True)


def to_prune(snapshots: Sequence[Mapping[str, Any]], keep: int) -> list[str]:
    """Names of our snapshots beyond the newest `keep`, oldest first; anyone else's are never listed."""
    if keep < 1:
        raise ValueError(f"keep must be 1 or more, not {keep}")
    return [s["name"] for s in reversed(ours(snapshots)[keep:])]


def chosen(snapshots: Sequence[Mapping[str, Any]], name: str) -> dict[str, Any] | str:
    """The snapshot a rollback restores (ours named `name`, else our newest), or why there is none."""
    mine = ours(snapshots)
    if not name:
        return (
            mine[0] if mine else "it has no snapshot made by this project (mlstack-*, taken by upgrade.yml)"
        )
    for snap in mine:
        if snap["name"] == name:
            return snap
    if any(str(s.get("name")) == name for s in snapshots):
        return f"its snapshot {name} was not made by this project: restore it with PVE's own tools"
    return f"it has no snapshot {name}"


def explain(what: str, pve_text: str) -> str:
    """A refused snapshot call (`what`: "snapshot CT 120") in words that say what to do; PVE's own
    text is kept."""
    msg = f"PVE refused to {what}: {pve_text.strip().rstrip('.')}."
    if NOT_AVAILABLE in pve_text:
        msg += (
            " Its root disk is on a storage that cannot snapshot: move it to a snapshot-capable storage"
            " (zfspool, lvmthin, btrfs or rbd; set mlstack_rootfs_storage for new containers), or run"
            " without -e mlstack_upgrade_snapshot=true."
        )
    return msg
