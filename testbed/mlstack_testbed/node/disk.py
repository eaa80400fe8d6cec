"""The testbed's own disk, where the machine's root filesystem is an ext4 without a journal.

There a new file's inode is found by checking free inodes against the time each was freed, skipping the
ones freed in the last minutes (recently_deleted in fs/ext4/ialloc.c: most of the kernel time in a profile
of the template's unpack). The testbed makes and removes containers all day: unpacking the container
template took 5-8 s of kernel time after a container was removed, against 0.6 s on an ext4 with a journal
after the same removals. `up` therefore puts the folders where files come and go by the thousand
(/var/lib/lxc, the nodes' host root /var/lib/mlstack, the snapshot copies) on an ext4 image with a journal:
a sparse file beside the testbed's state, loop-mounted, its blocks given back to the
machine as files are removed (discard). On any other filesystem nothing is done.

It adopts a folder only while it is empty or absent (a fresh machine, or after a reboot, when the image is
mounted again): folders already holding containers or caches are left where they are, and `status` says so.
The disk outlives `down --purge` (it holds uv's cache, which a purge keeps); the purge unmounts what it holds
in the state dir before removing that.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..proc import run

IMAGE = Path("/var/lib/mlstack-testbed.ext4")
GIB = 1 << 30
# Room the image leaves on the machine's filesystem when it is made (it grows as it is written), and the
# least size worth making.
HEADROOM = 8 * GIB
SMALLEST = 16 * GIB
LARGEST = 1024 * GIB


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


def _check(ok: bool, what: str, detail: str) -> None:
    if not ok:
        raise RuntimeError(f"the testbed's disk: {what} failed: {detail}")


@dataclass
class Disk:
    image: Path
    # The image's subfolder for each folder it holds.
    folders: dict[str, Path]
    # Made only where the image's folder is on an ext4 without a journal (False: wherever it is).
    only_without_journal: bool = True

    @property
    def mount(self) -> Path:
        """Where the image is mounted; each folder it holds is a bind mount of one of its subfolders."""
        return self.image.with_suffix(".disk")

    def needed(self, table: list[Mount]) -> bool:
        return not self.only_without_journal or journalless_ext4(mount_of(self.image.parent, table))

    def state(self) -> dict[str, object]:
        """What status shows: whether the machine needs the disk, and where each folder lives."""
        table = mounts()
        where = {}
        for sub, folder in self.folders.items():
            m = mount_of(folder, table)
            held = m.target == str(folder) and m.root.rstrip("/").endswith("/" + sub)
            where[str(folder)] = "on the testbed's disk" if held else f"on {m.target} ({m.fstype})"
        image = str(self.image) if self.image.is_file() else None
        return {"needed": self.needed(table), "image": image, "folders": where}

    def _make_image(self) -> None:
        st = os.statvfs(self.image.parent)
        size = min(LARGEST, (st.f_bavail * st.f_frsize - HEADROOM) // GIB * GIB)
        if size < SMALLEST:
            raise RuntimeError(
                f"the testbed's disk: not made, {self.image.parent} has less than "
                f"{(SMALLEST + HEADROOM) // GIB} GiB free"
            )
        partial = self.image.with_suffix(".partial")
        with open(partial, "wb") as f:
            f.truncate(size)  # sparse: it takes room only as it is written
        r = run(["mkfs.ext4", "-q", "-F", "-L", "mlstack-testbed", str(partial)], timeout=300)
        if not r.ok:
            partial.unlink(missing_ok=True)
        _check(r.ok, "mkfs.ext4", r.detail())
        partial.replace(self.image)

    def release(self, under: Path) -> list[str]:
        """Unmount the folders it holds under a folder about to be removed (`down --purge`'s state dir)."""
        table = mounts()
        done = []
        for folder in self.folders.values():
            if folder.is_relative_to(under) and mount_of(folder, table).target == str(folder):
                r = run(["umount", str(folder)], timeout=60)
                _check(r.ok, f"umount {folder}", r.detail())
                done.append(str(folder))
        return done

    def ensure(self) -> tuple[bool, str]:
        """Make and mount the disk where the machine needs it; (changed, what to report)."""
        table = mounts()
        if not self.needed(table):
            return False, "disk: the machine's filesystem has a journal (containers are made there)"
        changed = False
        if not self.image.is_file():
            self._make_image()
            changed = True
        if mount_of(self.mount, table).target != str(self.mount):
            self.mount.mkdir(exist_ok=True)
            # discard: the blocks of removed files go back to the machine's filesystem.
            r = run(["mount", "-o", "loop,discard", str(self.image), str(self.mount)], timeout=60)
            _check(r.ok, f"mount {self.image}", r.detail())
            changed = True
            table = mounts()
        kept = []
        for sub, folder in self.folders.items():
            if mount_of(folder, table).target == str(folder):
                continue
            if not _empty(folder):
                kept.append(str(folder))
                continue
            (self.mount / sub).mkdir(exist_ok=True)
            folder.mkdir(parents=True, exist_ok=True)
            r = run(["mount", "--bind", str(self.mount / sub), str(folder)], timeout=30)
            _check(r.ok, f"mount --bind {self.mount / sub} {folder}", r.detail())
            changed = True
        held = ", ".join(str(f) for f in self.folders.values() if str(f) not in kept)
        line = f"disk: {held or 'nothing'} on {self.image} (ext4 with a journal; the machine's has none)"
        if kept:
            line += f"; {', '.join(kept)} kept on the root filesystem (not empty)"
        return changed, line


def testbed_disk() -> Disk:
    """The folders where files come and go by the thousand: containers (/var/lib/lxc), their venvs (the
    nodes' host root) and the copies of their snapshots."""
    return Disk(
        IMAGE, {"lxc": paths.LXC_PATH, "mlstack": paths.host_root(), "snapshots": paths.SNAPSHOTS_DIR}
    )
