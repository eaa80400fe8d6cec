"""Dummy NVIDIA device nodes: character devices with NVIDIA's numbers and no driver behind them.

Opening one fails with ENXIO, which is the point: devN passthrough is exercised for real, and the
doctor must say "nodes present, driver not loaded". Nodes are created only where absent; the ones
created are recorded so `down` removes exactly those.
"""

import json
import os
import stat
from pathlib import Path

from .. import paths

NVIDIA_MAJOR = 195
NVIDIACTL_MINOR = 255


def used_char_majors() -> set[int]:
    majors: set[int] = set()
    section = ""
    for line in Path("/proc/devices").read_text().splitlines():
        if line.endswith(":"):
            section = line
        elif section.startswith("Character") and line.strip():
            majors.add(int(line.split()[0]))
    return majors


def pick_majors(n: int) -> list[int]:
    """Free majors from the top of the dynamic range (511 down), as the kernel hands them out."""
    used = used_char_majors() | {NVIDIA_MAJOR}
    free = [m for m in range(511, 383, -1) if m not in used]
    return free[:n]


def wanted_nodes(count: int) -> list[tuple[str, int, int]]:
    uvm, caps = pick_majors(2)
    nodes = [(f"/dev/nvidia{i}", NVIDIA_MAJOR, i) for i in range(count)]
    nodes += [
        ("/dev/nvidiactl", NVIDIA_MAJOR, NVIDIACTL_MINOR),
        ("/dev/nvidia-uvm", uvm, 0),
        ("/dev/nvidia-uvm-tools", uvm, 1),
        ("/dev/nvidia-caps/nvidia-cap1", caps, 1),
        ("/dev/nvidia-caps/nvidia-cap2", caps, 2),
    ]
    return nodes


def recorded() -> dict[str, object]:
    if paths.GPU_NODES_FILE.is_file():
        data: dict[str, object] = json.loads(paths.GPU_NODES_FILE.read_text())
        return data
    return {"created": [], "dirs": [], "requested": 0}


def ensure(count: int) -> list[str]:
    """Make /dev/nvidia0..count-1 and the ctl, uvm and caps nodes where absent; returns all their paths."""
    if count <= 0:
        return present()
    rec = recorded()
    created = list(rec["created"])  # type: ignore[call-overload]
    dirs = list(rec["dirs"])  # type: ignore[call-overload]
    existing_uvm = _rdev_major("/dev/nvidia-uvm")
    existing_caps = _rdev_major("/dev/nvidia-caps/nvidia-cap1")
    out = []
    for path, major, minor in wanted_nodes(count):
        if "uvm" in path and existing_uvm is not None:
            major = existing_uvm
        if "nvidia-caps" in path and existing_caps is not None:
            major = existing_caps
        p = Path(path)
        out.append(path)
        if p.exists():
            continue
        if not p.parent.is_dir():
            p.parent.mkdir(mode=0o755)
            dirs.append(str(p.parent))
        os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(major, minor))
        os.chmod(p, 0o666)
        created.append({"path": path, "major": major, "minor": minor})
    paths.GPU_NODES_FILE.write_text(
        json.dumps({"created": created, "dirs": dirs, "requested": count}, indent=1)
    )
    return out


def _rdev_major(path: str) -> int | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return os.major(st.st_rdev) if stat.S_ISCHR(st.st_mode) else None


def present() -> list[str]:
    """The NVIDIA nodes on this machine now (dummy or real)."""
    found = sorted(str(p) for p in Path("/dev").glob("nvidia*") if not p.is_dir())
    caps = Path("/dev/nvidia-caps")
    if caps.is_dir():
        found += sorted(str(p) for p in caps.iterdir())
    return found


def remove_created() -> list[str]:
    """Remove exactly the nodes (and dirs) the testbed made, if they are still what it made."""
    rec = recorded()
    removed = []
    for item in rec["created"]:  # type: ignore[attr-defined]
        p = Path(item["path"])
        try:
            st = os.stat(p)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(item["major"], item["minor"]):
            p.unlink()
            removed.append(str(p))
    for d in rec["dirs"]:  # type: ignore[attr-defined]
        try:
            Path(d).rmdir()
        except OSError:
            pass
    paths.GPU_NODES_FILE.unlink(missing_ok=True)
    return removed
