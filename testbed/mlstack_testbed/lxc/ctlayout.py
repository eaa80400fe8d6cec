"""Where a real container's files are: /var/lib/lxc/<vmid> (LXC's default lxcpath, containers named by vmid),
and whether it exists and runs.

Its own module because both realct (the lxc-* lifecycle) and hostroot (the machine's own root as rootfs)
need it, and realct's destroy needs hostroot: with the layout here, realct -> hostroot is one-way. `pct
exec` (every task in a container) reads a container's state from here without loading the lifecycle.
"""

import re
from pathlib import Path

from .. import paths
from ..proc import run


def ct_dir(vmid: int) -> Path:
    return paths.LXC_PATH / str(vmid)


def rootfs_dir(vmid: int) -> Path:
    return ct_dir(vmid) / "rootfs"


def passthrough_dir(vmid: int) -> Path:
    """The devN nodes are mknod'ed here before each start and bound into the container from here."""
    return ct_dir(vmid) / "passthrough"


def exists(vmid: int) -> bool:
    return (ct_dir(vmid) / "config").is_file()


def state(vmid: int) -> tuple[str, int | None]:
    """('running' | 'stopped' | 'missing', pid)."""
    if not exists(vmid):
        return "missing", None
    r = run(["lxc-info", "-n", str(vmid), "-s", "-p"], timeout=15)
    if not r.ok:
        return "stopped", None
    found = re.search(r"^State:\s*(\S+)", r.out, re.M)
    status = "running" if found and found.group(1) == "RUNNING" else "stopped"
    pid = re.search(r"^PID:\s*(\d+)", r.out, re.M)
    return status, int(pid.group(1)) if status == "running" and pid else None
