"""The machine's own root as a container's root filesystem: for a GPU machine with no network and no template.

`overlay` (the default): an overlayfs with lowerdir=/ and its upper and work dirs on a tmpfs private to
the container. The lower layer is the root filesystem alone, without the mounts below it, so what
the host mounts elsewhere (its driver folder /usr/local/nvidia, /proc, /tmp when it is a tmpfs...)
is NOT in the container unless a devN or mpN entry puts it there: exactly what passthrough must
prove. What the container writes (ld.so.conf.d, ldconfig's cache, /tmp, Triton's cache) lands in
the tmpfs and is gone at destroy: the host's root is never written.

`bind`: a plain, non-recursive bind of / (same view as the overlay) where overlayfs over / cannot be
mounted. The container then WRITES THE HOST'S ROOT (ldconfig's cache, for one): only for a
disposable machine, and only when asked for.

A container on the host's root cannot be unprivileged in the PVE sense (its files belong to the
host's uid 0, so they show as nobody:nogroup inside): it starts, and an unprivileged user inside
can read and run what is world-readable, which is what a permission test needs; its root cannot
write /etc. Mount points are created from the host side before start, as PVE's pre-start hook does.
"""

import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from ..proc import run
from . import lxcconf
from .ctlayout import ct_dir, rootfs_dir

MODES = ("overlay", "bind")
# The container's init: the host root's own init must not run again; this keeps the CT alive.
INIT_LINES = ["lxc.init.cmd = /bin/sleep infinity"]


class HostRootError(RuntimeError):
    pass


def rw_dir(vmid: int) -> Path:
    return ct_dir(vmid) / "hostroot-rw"


def marker(vmid: int) -> Path:
    return ct_dir(vmid) / "hostroot"


def is_hostroot(vmid: int) -> bool:
    """A container on the machine's own root (marked at create), or any whose rootfs is a mount point."""
    return marker(vmid).exists() or rw_dir(vmid).exists() or is_mountpoint(rootfs_dir(vmid))


def _unescape(field: str) -> str:
    return field.replace("\\040", " ").replace("\\011", "\t").replace("\\012", "\n").replace("\\134", "\\")


def mountpoints() -> list[str]:
    out = []
    with open("/proc/self/mountinfo", encoding="utf-8") as f:
        for line in f:
            out.append(_unescape(line.split()[4]))
    return out


def is_mountpoint(path: Path) -> bool:
    return str(path) in mountpoints()


def mount_of(path: str) -> str:
    """The mount point holding path (longest prefix among the mount points)."""
    real = os.path.realpath(path)
    best = "/"
    for mp in mountpoints():
        if (real == mp or real.startswith(mp.rstrip("/") + "/")) and len(mp) > len(best):
            best = mp
    return best


def mount(vmid: int, mode: str = "overlay", size_mib: int = 16384) -> str:
    """Mount the container's rootfs (idempotent); returns the lxc.rootfs.path value."""
    if mode not in MODES:
        raise HostRootError(f"unknown host-root mode {mode!r} (one of {', '.join(MODES)})")
    root = rootfs_dir(vmid)
    root.mkdir(parents=True, exist_ok=True)
    if is_mountpoint(root):
        return f"dir:{root}"
    if mode == "bind":
        r = run(["mount", "--bind", "/", str(root)], timeout=30)
        if not r.ok:
            raise HostRootError(f"bind mount of / failed: {r.detail()}")
        return f"dir:{root}"
    rw = rw_dir(vmid)
    rw.mkdir(exist_ok=True)
    if not is_mountpoint(rw):
        r = run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0755", "tmpfs", str(rw)], timeout=30)
        if not r.ok:
            raise HostRootError(f"tmpfs for the overlay failed: {r.detail()}")
    for d in ("upper", "work"):
        (rw / d).mkdir(exist_ok=True)
    opts = f"lowerdir=/,upperdir={rw / 'upper'},workdir={rw / 'work'}"
    r = run(["mount", "-t", "overlay", "overlay", "-o", opts, str(root)], timeout=30)
    if not r.ok:
        run(["umount", str(rw)], timeout=30)
        raise HostRootError(f"overlayfs over / failed ({opts}): {r.detail()}")
    return f"dir:{root}"


def prepare_targets(vmid: int, mounts: Iterable[lxcconf.MountSpec]) -> None:
    """Create mpN mount points inside the rootfs from the host side (never through a link out of it)."""
    root = rootfs_dir(vmid).resolve()
    for m in mounts:
        target = root / m.target.lstrip("/")
        parent = target
        while not parent.exists():
            parent = parent.parent
        if root not in (parent.resolve(), *parent.resolve().parents):
            continue  # a link leading out of the rootfs: leave it to LXC's create=dir inside
        target.mkdir(parents=True, exist_ok=True)


def unmount(vmid: int) -> None:
    """Unmount the rootfs and its tmpfs; raises unless both are gone (destroy depends on it)."""
    for path in (rootfs_dir(vmid), rw_dir(vmid)):
        for _ in range(3):
            if not is_mountpoint(path):
                break
            run(["umount", str(path)], timeout=60)
        if is_mountpoint(path):
            run(["umount", "-l", str(path)], timeout=60)
        if is_mountpoint(path):
            raise HostRootError(f"{path} is still mounted; not removing the container")


def remove(vmid: int) -> None:
    """Remove the container's directory once nothing is mounted under it: never deletes through a mount."""
    unmount(vmid)
    ct = ct_dir(vmid)
    if not ct.exists():
        return
    ct_real = str(ct.resolve())
    busy = [mp for mp in mountpoints() if mp == ct_real or mp.startswith(ct_real + "/")]
    if busy:
        raise HostRootError(f"mounts remain under {ct}: {', '.join(busy)}; not removing it")
    shutil.rmtree(ct)
