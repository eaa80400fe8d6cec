"""Where a real container's files are: /var/lib/lxc/<vmid> (LXC's default lxcpath, containers named by vmid).

Its own module because both realct (the lxc-* lifecycle) and hostroot (the machine's own root as rootfs)
need it, and realct's destroy needs hostroot: with the layout here, realct -> hostroot is one-way.
"""

from pathlib import Path

from .. import paths


def ct_dir(vmid: int) -> Path:
    return paths.LXC_PATH / str(vmid)


def rootfs_dir(vmid: int) -> Path:
    return ct_dir(vmid) / "rootfs"


def passthrough_dir(vmid: int) -> Path:
    """The devN nodes are mknod'ed here before each start and bound into the container from here."""
    return ct_dir(vmid) / "passthrough"
