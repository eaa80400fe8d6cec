"""Is the doctor running in a container? Decided from evidence a container runtime leaves at run time.

Not from files an image may carry: `/.dockerenv` stays in every root filesystem exported from a Docker
container, so a VM booted from such an image has it too (and `systemd-detect-virt` then says docker).
It counts only beside a root filesystem that looks like a container's (overlay). A VM is not a
container: the CPU's `hypervisor` flag is reported, never taken as container evidence.
"""

from __future__ import annotations

import os
import re

CONTAINER_ROOT_FS = ("overlay", "aufs", "fuse-overlayfs")
CGROUP_MARKERS = re.compile(r"/(docker|lxc|kubepods|libpod|containerd|machine\.slice/machine-)")


def _read(root: str, rel: str) -> bytes | None:
    try:
        with open(os.path.join(root, rel), "rb") as f:
            return f.read()
    except OSError:
        return None


def _root_fs(root: str) -> tuple[str, str] | None:
    """(fs type, source) of the mount at / in this process's mount namespace."""
    text = _read(root, "proc/self/mountinfo") or b""
    found = None
    for line in text.decode(errors="replace").splitlines():
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) >= 5 and fields[4] == "/" and right:
            fstype, source = [*right.split(), "", ""][:2]
            found = (fstype, source)  # the last mount at / is the one in effect
    return found


def container(root: str = "/") -> tuple[bool, list[str]]:
    """(in a container, the evidence read); `root` lets tests point it at a fake tree."""
    strong: list[str] = []
    notes: list[str] = []
    manager = (_read(root, "run/systemd/container") or b"").strip()
    if manager:
        strong.append(f"/run/systemd/container: {manager.decode(errors='replace')}")
    environ = _read(root, "proc/1/environ")
    if environ is None:
        notes.append("/proc/1/environ unreadable")
    else:
        # The key exactly: a variable that merely ends in "container=" (DEVCONTAINER=...) is no evidence.
        for var in environ.split(b"\0"):
            if var.startswith(b"container="):
                strong.append(f"/proc/1/environ: {var.decode(errors='replace')}")
    if _read(root, "run/.containerenv") is not None:
        strong.append("/run/.containerenv (podman)")
    cgroup = (_read(root, "proc/1/cgroup") or b"").decode(errors="replace")
    marker = CGROUP_MARKERS.search(cgroup)
    if marker:
        strong.append(f"/proc/1/cgroup names {marker.group(1)}")
    fs = _root_fs(root)
    overlay = fs is not None and fs[0] in CONTAINER_ROOT_FS
    if overlay:
        strong.append(f"root filesystem is {fs[0]}")  # type: ignore[index]
    if _read(root, ".dockerenv") is not None:
        if overlay or strong:
            strong.append("/.dockerenv")
        else:
            where = f"{fs[1]} ({fs[0]})" if fs else "an unknown filesystem"
            notes.append(f"/.dockerenv ignored: the root is {where}, not a container's; left in the image")
    cpuinfo = _read(root, "proc/cpuinfo") or b""
    if re.search(rb"^flags\s*:.*\bhypervisor\b", cpuinfo, re.M):
        notes.append("cpu flag hypervisor: a virtual machine (not by itself a container)")
    if not strong:
        notes.insert(
            0, "no container evidence: /run/systemd/container, container=, containerenv, cgroup, overlay root"
        )
    return bool(strong), strong + notes
