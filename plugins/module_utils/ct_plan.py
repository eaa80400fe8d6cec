"""What a container needs, from one read of the PVE API: created, configured, resized, started, restarted.

The gpu_container role reads every guest once (with its config, its pending changes and its status) and
asks this for each of its containers, so a rerun on containers that already match makes no API call and
runs no `pct` on the node for them. A step that is needed still runs the same way as on a first run.
mlstack.pve.pct_config reaches the same answer from `pct pending` on the node (reconcile), so what is
planned and what is done are computed by one function.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.mlstack.pve.plugins.module_utils import ct_settings, ct_table
from ansible_collections.mlstack.pve.plugins.module_utils.pct import plan_changes


def guest_of(guests: list[dict[str, Any]] | None, vmid: int) -> dict[str, Any] | None:
    """The LXC guest with `vmid` among those read, or None."""
    for guest in guests or []:
        if int(guest.get("vmid", -1)) == int(vmid) and guest.get("type", "lxc") == "lxc":
            return guest
    return None


def _strings(config: dict[str, Any]) -> dict[str, str]:
    return {str(k): ct_settings.pve_value(v) for k, v in config.items()}


def reconcile(
    current: dict[str, Any],
    view: dict[str, Any],
    running: bool,
    options: dict[str, Any],
    stated: dict[str, str],
    disk_gb: Any = None,
) -> dict[str, Any]:
    """What makes a container's config hold what the inventory states: `current` is the config in effect,
    `view` the one with PVE's pending changes (what its next start runs with). Returns {set, deleted,
    resize, refused, changes: {name: {old, new, applies}}, restart_needed: [names]}."""
    current, view = _strings(current), _strings(view)
    passthrough, deleted = plan_changes(view, {str(k): str(v) for k, v in options.items()}, True)
    to_set = {**ct_settings.setting_changes(view, stated), **passthrough}
    resize, refused = ct_settings.disk_change(view.get("rootfs"), disk_gb)
    changes: dict[str, dict[str, Any]] = {}
    for key in sorted(to_set):
        changes[name_of(key)] = {
            "old": view.get(key),
            "new": to_set[key],
            "applies": ct_settings.applies(key, running, current),
        }
    for key in deleted:
        changes[name_of(key)] = {
            "old": view.get(key),
            "new": None,
            "applies": ct_settings.applies(key, running, current, deleted=True),
        }
    if resize:
        have = ct_settings.disk_gib(view.get("rootfs"))
        changes["disk_gb"] = {"old": f"{have:g}G", "new": resize, "applies": ct_settings.LIVE}
    # What waits for the next start: changes PVE will leave pending, and those an earlier run left.
    waiting = {name_of(k) for k in ct_settings.pending_keys(current, view, set(stated))} if running else set()
    waiting |= {n for n, c in changes.items() if c["applies"] == ct_settings.RESTART}
    return {
        "set": to_set,
        "deleted": deleted,
        "resize": resize,
        "refused": refused,
        "changes": changes,
        "restart_needed": sorted(waiting),
    }


def name_of(key: str) -> str:
    """The inventory's name of a PVE key (memory -> memory_mb); devN/mpN are their own."""
    return ct_settings.INVENTORY_NAME.get(key, key)


def plan(
    guest: dict[str, Any] | None,
    options: dict[str, Any],
    stated: dict[str, str] | None = None,
    disk_gb: Any = None,
    pending_guest: dict[str, Any] | None = None,
    allow_restart: bool = False,
) -> dict[str, Any]:
    """{create, configure, start, restart, set, deleted, resize, refused, changes, restart_needed}: which
    steps a container needs. `guest` is read with its current config, `pending_guest` (if read) with its
    pending changes applied. Without a config in the read (a guest listed without one), configuring is
    planned: pct_config then reads and decides."""
    stated = stated or {}
    desired = {str(k): str(v) for k, v in options.items()}
    nothing: dict[str, Any] = {
        "resize": "",
        "refused": "",
        "changes": {},
        "restart_needed": [],
        "restart": False,
    }
    if guest is None:
        return {**nothing, "create": True, "configure": True, "start": True, "set": desired, "deleted": []}
    config = guest.get("config")
    running = guest.get("status") == "running"
    if not isinstance(config, dict):
        return {
            **nothing,
            "create": False,
            "configure": True,
            "start": not running,
            "set": {**stated, **desired},
            "deleted": [],
        }
    pending = (pending_guest or {}).get("config")
    view = pending if isinstance(pending, dict) else config
    found = reconcile(config, view, running, desired, stated, disk_gb)
    return {
        **found,
        "create": False,
        "configure": bool(found["set"] or found["deleted"] or found["resize"]),
        "start": not running,
        "restart": bool(running and allow_restart and found["restart_needed"]),
    }


def describe(vmid: int, node: str, planned: dict[str, Any], allow_restart: bool) -> list[str]:
    """The plan of one container in lines a person reads (the check-mode plan, and what a run changes)."""
    where = f"CT {vmid} on {node}"
    if planned.get("refused"):
        return [f"{where}: refused: {planned['refused']}"]
    if planned["create"]:
        made = planned.get("create_args") or {}
        # The sizes the create gives it (the table's numbers a create takes).
        sizes = [(s.key, s.create) for s in ct_table.ENTRY.values() if s.create and s.type == "int"]
        shown = ", ".join(f"{name} {made[key]}" for name, key in sizes if key in made)
        return [f"{where}: create it ({shown}), pass its GPUs through, bind the caches (devN/mpN), start it"]
    lines = [
        f"{where}: {name} {c['old'] if c['old'] is not None else '(unset)'} -> "
        f"{c['new'] if c['new'] is not None else '(removed)'} ({c['applies']})"
        for name, c in planned["changes"].items()
    ]
    if planned["restart_needed"]:
        waiting = ", ".join(planned["restart_needed"])
        if allow_restart:
            lines.append(f"{where}: restart it, for {waiting} (mlstack_allow_restart is true)")
        else:
            lines.append(
                f"{where}: restart needed for {waiting}, which take effect at its next start; it is left"
                f" running (mlstack_allow_restart is false): run `pct reboot {vmid}` on {node}, or rerun"
                " with -e mlstack_allow_restart=true"
            )
    if planned["start"]:
        lines.append(f"{where}: start it")
    return lines
