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


# ------------------------------------------------------------------ nvidia-modprobe, as a node runs it


def module_missing_marker(node: str) -> Path:
    """Present while node's NVIDIA kernel module cannot load (`testbed reboot NODE --module-missing`)."""
    return paths.RUN_DIR / f"nvidia-module-missing.{node}"


def _wanted_by_flags(args: list[str]) -> list[str] | None:
    """The nodes `nvidia-modprobe [-u] [-c N]` makes; None for an option it does not know."""
    want: list[str] = []
    i = 0
    while i < len(args):
        a = args[i]
        if a in ("-u", "--unified-memory"):
            want += ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"]
        elif a in ("-m", "--modeset", "-s", "--syslog"):
            pass
        elif a.split("=", 1)[0] in ("-c", "--create-nvidia-device-file"):
            value = a.split("=", 1)[1] if "=" in a else (args[i + 1] if i + 1 < len(args) else "")
            i += 0 if "=" in a else 1
            if not value.isdigit():
                return None
            want += [f"/dev/nvidia{int(value)}", "/dev/nvidiactl"]
        else:
            return None
        i += 1
    return want


def modprobe_main(argv: list[str] | None = None) -> int:
    """The node's `nvidia-modprobe`: "loads" the module and makes the nodes asked for, with the numbers
    the testbed gave them (gpu-nodes.json); a node it never made is one this node's driver lacks (exit 1,
    silent, as NVIDIA's). While the node's module is missing it fails as modprobe does."""
    import sys

    args = sys.argv[1:] if argv is None else argv
    want = _wanted_by_flags(args)
    if want is None:
        print(f"nvidia-modprobe: unrecognized option: {' '.join(args)}", file=sys.stderr)
        return 1
    if module_missing_marker(paths.NODE).exists():
        print(
            f"modprobe: FATAL: Module nvidia not found in directory /lib/modules/{os.uname().release}",
            file=sys.stderr,
        )
        return 1
    made = {str(c["path"]): c for c in recorded()["created"]}  # type: ignore[attr-defined]
    rc = 0
    for path in want:
        p = Path(path)
        if p.exists():
            continue
        item = made.get(path)
        if item is None:
            rc = 1
            continue
        p.parent.mkdir(mode=0o755, exist_ok=True)
        os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(int(item["major"]), int(item["minor"])))
        os.chmod(p, 0o666)
    return rc


def remove_for_reboot(all_nodes: bool) -> list[str]:
    """What a node's reboot takes away: the uvm nodes the testbed made (with `all_nodes`, also
    /dev/nvidiaN and nvidiactl), as a boot without anything that loads nvidia-uvm leaves /dev. Only nodes
    still as recorded are removed, so restore_created() puts exactly them back."""
    removed = []
    for item in recorded()["created"]:  # type: ignore[attr-defined]
        path = str(item["path"])
        if "nvidia-caps" in path or ("uvm" not in path and not all_nodes):
            continue
        try:
            st = os.stat(path)
        except OSError:
            continue
        if stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(item["major"], item["minor"]):
            os.unlink(path)
            removed.append(path)
    return removed


def restore_created() -> list[str]:
    """Make again every node the testbed made that is gone, with its recorded numbers and mode 0666."""
    made = []
    for item in recorded()["created"]:  # type: ignore[attr-defined]
        p = Path(str(item["path"]))
        if p.exists():
            continue
        p.parent.mkdir(mode=0o755, exist_ok=True)
        os.mknod(p, stat.S_IFCHR | 0o666, os.makedev(int(item["major"]), int(item["minor"])))
        os.chmod(p, 0o666)
        made.append(str(p))
    return made
