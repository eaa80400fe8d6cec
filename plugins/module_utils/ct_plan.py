"""What a container needs, from one read of the PVE API: created, configured (devN/mpN), started.

The gpu_container role reads every guest once (with its config and status) and asks this for each of
its containers, so a rerun on containers that already match makes no API call and runs no `pct` on
the node for them. A step that is needed still runs the same way as on a first run.
"""

from __future__ import annotations

from typing import Any

from ansible_collections.mlstack.pve.plugins.module_utils.pct import plan_changes


def guest_of(guests: list[dict[str, Any]], vmid: int) -> dict[str, Any] | None:
    """The LXC guest with `vmid` among those read, or None."""
    for guest in guests:
        if int(guest.get("vmid", -1)) == int(vmid) and guest.get("type", "lxc") == "lxc":
            return guest
    return None


def plan(guest: dict[str, Any] | None, options: dict[str, Any]) -> dict[str, Any]:
    """{create, configure, start, set, deleted}: which steps a container needs. Without its config in
    the read (a guest listed without one), configuring is planned: pct_config then reads and decides."""
    desired = {str(k): str(v) for k, v in options.items()}
    if guest is None:
        return {"create": True, "configure": True, "start": True, "set": desired, "deleted": []}
    config = guest.get("config")
    if not isinstance(config, dict):
        to_set, to_delete = desired, []
        configure = True
    else:
        to_set, to_delete = plan_changes({str(k): str(v) for k, v in config.items()}, desired, True)
        configure = bool(to_set or to_delete)
    return {
        "create": False,
        "configure": configure,
        "start": guest.get("status") != "running",
        "set": to_set,
        "deleted": to_delete,
    }
