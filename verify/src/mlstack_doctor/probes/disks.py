"""The disks the stack writes to, and whether one is nearly full (host stage, fast tier, no torch).

The container's root disk (apt, logs, the doctor's reports), the venv's filesystem (the node's shared uv
store), the Triton cache's and $TMPDIR's (gcc and Triton's builds): each filesystem once, with the paths
that live on it. A filesystem with less free than the thresholds below warns, naming the path, the free
and the total bytes; a full one stops apt mid-unpack, uv mid-download and Triton mid-compile, each with
its own words far from the cause.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import asdict, dataclass

from mlstack_doctor.context import Context
from mlstack_doctor.diagnosis import fix_for
from mlstack_doctor.probes.toolchain import triton_cache_path
from mlstack_doctor.record import Result, Stage, passed, warned

NAME, STAGE = "disk_space", Stage.HOST
# Nearly full: less free than either threshold (the one place they are set).
NEARLY_FULL_BYTES = 1 << 30  # below what the toolchain's apt install or one venv's new wheels need
NEARLY_FULL_FRACTION = 0.05


def watched() -> list[tuple[str, str]]:
    """(what, path) of each place the stack writes, as this process would resolve it."""
    return [
        ("root disk", "/"),
        ("venv", os.path.realpath(sys.prefix)),
        ("Triton cache", triton_cache_path()[0]),
        ("TMPDIR", tempfile.gettempdir()),
    ]


def _existing(path: str) -> str:
    while not os.path.exists(path) and os.path.dirname(path) != path:
        path = os.path.dirname(path)
    return path


def nearly_full(free: int, total: int) -> bool:
    return free < NEARLY_FULL_BYTES or (total > 0 and free < total * NEARLY_FULL_FRACTION)


@dataclass
class Disk:
    paths: list[str]
    free_bytes: int
    total_bytes: int

    def said(self) -> str:
        where = ", ".join(self.paths)
        return f"{where}: {self.free_bytes} bytes free of {self.total_bytes} ({self.free_bytes >> 20} MiB)"


def disk_space(ctx: Context) -> Result:
    disks: dict[int, Disk] = {}
    for what, path in watched():
        where = _existing(path)
        try:
            st, dev = os.statvfs(where), os.stat(where).st_dev
        except OSError:
            continue
        disk = disks.setdefault(dev, Disk([], st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize))
        disk.paths.append(f"{path} ({what})")
    full = [d for d in disks.values() if nearly_full(d.free_bytes, d.total_bytes)]
    ev = {
        "disks": [asdict(d) for d in disks.values()],
        "nearly_full_bytes": NEARLY_FULL_BYTES,
        "nearly_full_fraction": NEARLY_FULL_FRACTION,
    }
    if full:
        path = full[0].paths[0].split(" (")[0]
        summary = "nearly full: " + "; ".join(d.said() for d in full)
        return warned(NAME, STAGE, summary, "DISK_NEARLY_FULL", fix_for("DISK_NEARLY_FULL", path=path), **ev)
    summary = "room on every disk the stack writes to: " + "; ".join(d.said() for d in disks.values())
    return passed(NAME, STAGE, summary, **ev)
