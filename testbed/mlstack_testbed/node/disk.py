"""The testbed's own disk, where the machine's root filesystem is an ext4 without a journal.

On such a filesystem ext4 checks every free inode it considers against the time it was freed and skips the
ones freed in the last minutes (fs/ext4/ialloc.c, recently_deleted: done only without a journal). The
testbed makes and removes containers all day, so each new file scans past thousands of recently freed
inodes: unpacking the container template took 5-8 s of kernel time after a container was destroyed,
against 0.6 s on an ext4 with a journal. `up` therefore puts the folders where containers and their venvs
are made and removed (/var/lib/lxc, and the nodes' host root /var/lib/mlstack) on an ext4 filesystem image
with a journal: a sparse file beside the testbed's state, loop-mounted, its blocks given back to the
machine as files are removed (discard). On any other filesystem nothing is done.

It adopts a folder only while it is empty or absent (a fresh machine, or after a reboot, when the image is
mounted again): folders already holding containers or caches are left where they are, and `status` says so.
The disk outlives `down --purge` (it holds uv's cache, which a purge keeps).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..proc import run

IMAGE = Path(os.environ.get("MLSTACK_TESTBED_DISK_IMAGE", "/var/lib/mlstack-testbed.ext4"))
# Where the image is mounted; each adopted folder is a bind mount of one of its subfolders.
MOUNT = IMAGE.with_suffix(".disk")
GIB = 1 << 30
# Room the image leaves on the machine's filesystem when it is made (it grows as it is written), and the
# least size worth making.
HEADROOM = 8 * GIB
SMALLEST = 16 * GIB
LARGEST = 1024 * GIB


def adopted_folders() -> dict[str, Path]:
    """The image's subfolder for each folder it holds."""
    return {"lxc": paths.LXC_PATH, "mlstack": paths.host_root()}


@dataclass
class Mount:
    device: str  # major:minor
    fstype: str
    target: str
    root: str


def _unescape(field: str) -> str:
    return field.encode().decode("unicode_escape") if "\\" in field else field


def mounts(mountinfo: Path = Path("/proc/self/mountinfo")) -> list[Mount]:
    out = []
    for line in mountinfo.read_text().splitlines():
        left, _, right = line.partition(" - ")
        f, r = left.split(), right.split()
        if len(f) >= 5 and r:
            out.append(Mount(device=f[2], fstype=r[0], target=_unescape(f[4]), root=_unescape(f[3])))
    return out


def mount_of(path: Path, table: list[Mount]) -> Mount:
    """The mount that holds path (the longest mount point above it; the last one mounted wins)."""
    best: Mount | None = None
    p = str(path)
    for m in table:
        t = m.target
        if (p == t or p.startswith(t.rstrip("/") + "/")) and (best is None or len(t) >= len(best.target)):
            best = m
    if best is None:
        raise RuntimeError(f"no mount holds {path}")
    return best


def journalless_ext4(
    m: Mount, jbd2: Path = Path("/proc/fs/jbd2"), block: Path = Path("/sys/dev/block")
) -> bool:
    """An ext4 mount whose block device has no journal: the kernel lists each journal in jbd2 as
    <device>-<inode>. A device it cannot name counts as journalled (nothing is changed)."""
    if m.fstype != "ext4":
        return False
    try:
        dev = os.readlink(block / m.device).rsplit("/", 1)[-1]
        journals = [j.name.rsplit("-", 1)[0] for j in jbd2.iterdir()] if jbd2.is_dir() else []
    except OSError:
        return False
    return dev not in journals


def _empty(folder: Path) -> bool:
    return not folder.exists() or (folder.is_dir() and not any(folder.iterdir()))


def _image_size(where: Path) -> int:
    st = os.statvfs(where)
    return min(LARGEST, (st.f_bavail * st.f_frsize - HEADROOM) // GIB * GIB)


def state() -> dict[str, object]:
    """What status shows: whether the machine needs the disk, and where each folder lives."""
    table = mounts()
    needed = journalless_ext4(mount_of(IMAGE.parent, table))
    folders = {}
    for sub, folder in adopted_folders().items():
        m = mount_of(folder, table)
        on_disk = m.target == str(folder) and m.root.rstrip("/").endswith("/" + sub)
        folders[str(folder)] = "on the testbed's disk" if on_disk else f"on {m.target} ({m.fstype})"
    return {"needed": needed, "image": str(IMAGE) if IMAGE.is_file() else None, "folders": folders}


def _check(r_ok: bool, what: str, detail: str) -> None:
    if not r_ok:
        raise RuntimeError(f"the testbed's disk: {what} failed: {detail}")


def ensure() -> tuple[bool, str]:
    """Make and mount the disk where the machine needs it; (changed, what to report)."""
    table = mounts()
    if not journalless_ext4(mount_of(IMAGE.parent, table)):
        return False, "disk: the machine's filesystem has a journal (containers are made there)"
    changed = False
    if not IMAGE.is_file():
        size = _image_size(IMAGE.parent)
        if size < SMALLEST:
            return False, (
                f"disk: not made, {IMAGE.parent} has less than {(SMALLEST + HEADROOM) // GIB} GiB free "
                "(containers are made on the root filesystem, slower)"
            )
        partial = IMAGE.with_suffix(".partial")
        with open(partial, "wb") as f:
            f.truncate(size)
        r = run(["mkfs.ext4", "-q", "-F", "-L", "mlstack-testbed", str(partial)], timeout=300)
        if not r.ok:
            partial.unlink(missing_ok=True)
        _check(r.ok, "mkfs.ext4", r.detail())
        partial.replace(IMAGE)
        changed = True
    if mount_of(MOUNT, table).target != str(MOUNT):
        MOUNT.mkdir(exist_ok=True)
        r = run(["mount", "-o", "loop,discard", str(IMAGE), str(MOUNT)], timeout=60)
        _check(r.ok, f"mount {IMAGE}", r.detail())
        changed = True
        table = mounts()
    kept = []
    for sub, folder in adopted_folders().items():
        if mount_of(folder, table).target == str(folder):
            continue
        if not _empty(folder):
            kept.append(str(folder))
            continue
        (MOUNT / sub).mkdir(exist_ok=True)
        folder.mkdir(parents=True, exist_ok=True)
        r = run(["mount", "--bind", str(MOUNT / sub), str(folder)], timeout=30)
        _check(r.ok, f"mount --bind {MOUNT / sub} {folder}", r.detail())
        changed = True
    held = ", ".join(str(f) for f in adopted_folders().values() if str(f) not in kept)
    line = f"disk: {held or 'nothing'} on {IMAGE} (ext4 with a journal; the machine's has none)"
    if kept:
        line += f"; {', '.join(kept)} kept on the root filesystem (not empty)"
    return changed, line
