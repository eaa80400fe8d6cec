"""Reading what the pve_host role checks and manages on a PVE node, in one pass: the PVE version, the
NVIDIA kernel module, the NVIDIA device nodes, the GPUs nvidia-smi lists, the templates on a storage,
the shared directories, where paths really lead and whether the node's running containers still have
the node's folders they bind. The role then runs a changing task only for what differs, so a rerun on
an unchanged node costs one round trip.

Nothing here changes anything. What cannot be read is reported as such (a directory that cannot be
read differs; a command that fails says why), never as a good state.
"""

from __future__ import annotations

import glob
import grp
import os
import pwd
import re
import stat
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ansible_collections.mlstack.pve.plugins.module_utils.nvidia_facts import (
    KERNEL_MODULE,
    NVIDIA_SMI_GPUS,
    parse_nvidia_smi_csv,
)
from ansible_collections.mlstack.pve.plugins.module_utils.pct import PCT, parse_config

Runner = Callable[[list[str]], tuple[int, str, str]]

DRIVER_FILE = "/proc/driver/nvidia/version"
_PVE = re.compile(r"pve-manager/([0-9.]+)")
NVIDIA_SMI = list(NVIDIA_SMI_GPUS)
# Where PVE keeps the node's container configs (its cluster filesystem); `pct config` where there is none.
PVE_LXC_DIR = "/etc/pve/lxc"
_MP_KEY = re.compile(r"^mp(\d+)$")
# How the kernel shows a mount whose source folder was removed: its root in /proc/<pid>/mountinfo.
_DELETED = "//deleted"
_OCTAL = re.compile(r"\\([0-7]{3})")
# What can be read; `gather` picks among them (the template, directories and paths are read when given).
GATHER = ("pve_version", "driver", "devices", "gpus")


def pve_version(run: Runner) -> str:
    """pve-manager's version from `pveversion`; ValueError when it fails or prints none."""
    rc, out, err = run(["pveversion"])
    if rc != 0:
        raise ValueError(f"pveversion exited {rc}: {(err or out).strip() or 'no output'}")
    m = _PVE.search(out)
    if not m:
        raise ValueError(f"pveversion printed no pve-manager version: {out.strip() or 'nothing'}")
    return m.group(1)


def driver_version(path: str = DRIVER_FILE) -> str:
    """The loaded NVIDIA kernel module's version; empty when no driver is loaded."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            m = KERNEL_MODULE.search(f.read())
    except OSError:
        return ""
    return m.group(1) if m else ""


def device_nodes(dev: str = "/dev") -> list[str]:
    """/dev/nvidia* and /dev/nvidia-caps/nvidia*, sorted; the nvidia-caps folder itself is not a node."""
    found = glob.glob(os.path.join(dev, "nvidia*")) + glob.glob(os.path.join(dev, "nvidia-caps", "nvidia*"))
    return sorted(p for p in found if p != os.path.join(dev, "nvidia-caps"))


def gpus(run: Runner) -> tuple[list[dict[str, Any]], str]:
    """(GPUs nvidia-smi lists, why the list is empty); no driver answering is an unknown architecture."""
    rc, out, err = run(NVIDIA_SMI)
    if rc == 0:
        return parse_nvidia_smi_csv(out), ""
    if rc == 127:
        return [], "nvidia-smi is not installed"
    said = (out.strip() or err.strip()).splitlines()
    return [], f"nvidia-smi exited {rc}: {said[0] if said else 'no output'}"


def templates(storage: str, run: Runner) -> list[str]:
    """The volids `pveam list STORAGE` prints; ValueError when pveam fails."""
    rc, out, err = run(["pveam", "list", storage])
    if rc != 0:
        raise ValueError(f"pveam list {storage} exited {rc}: {(err or out).strip() or 'no output'}")
    return [line.split()[0] for line in out.splitlines() if line.strip() and ":" in line.split()[0]]


def _uid(owner: Any) -> int | None:
    if owner in (None, ""):
        return None
    return int(owner) if str(owner).isdigit() else pwd.getpwnam(str(owner)).pw_uid


def _gid(group: Any) -> int | None:
    if group in (None, ""):
        return None
    return int(group) if str(group).isdigit() else grp.getgrnam(str(group)).gr_gid


def directory_differs(item: dict[str, Any]) -> str | None:
    """Why `path` is not a directory with the given owner, group and mode (symlinks followed, as
    ansible.builtin.file follows them); None when it is."""
    try:
        st = os.stat(item["path"])
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        return f"unreadable: {e.strerror or e}"
    if not stat.S_ISDIR(st.st_mode):
        return "not a directory"
    try:
        uid, gid = _uid(item.get("owner")), _gid(item.get("group"))
    except KeyError as e:  # a name the node does not know: the file task will say so
        return f"owner or group unknown on the node: {e}"
    if (uid is not None and st.st_uid != uid) or (gid is not None and st.st_gid != gid):
        return f"owned by {st.st_uid}:{st.st_gid}, not {item.get('owner', '')}:{item.get('group', '')}"
    if item.get("mode") and stat.S_IMODE(st.st_mode) != int(str(item["mode"]), 8):
        return f"mode {stat.S_IMODE(st.st_mode):04o}, not {item['mode']}"
    return None


def resolve(path: str) -> dict[str, Any]:
    """Where `path` really leads (symlinks and '..' followed, as `realpath -m`) and whether it exists
    (as `realpath -e` succeeds)."""
    real = os.path.realpath(path)
    return {"real": real, "exists": os.path.exists(real)}


def init_pid(vmid: int, run: Runner) -> int | None:
    """The container's init PID from the node's LXC (`lxc-info -n VMID -p -H`); None when it does not run."""
    rc, out, _ = run(["lxc-info", "-n", str(vmid), "-p", "-H"])
    text = out.strip()
    return int(text) if rc == 0 and text.isdigit() else None


def container_config(vmid: int, run: Runner, config_dir: str = PVE_LXC_DIR) -> dict[str, str]:
    """The container's current PVE config (what it started with, not pending changes): its file in PVE's
    cluster filesystem, else `pct config --current`; {} when neither has it (not a container of this node)."""
    try:
        with open(os.path.join(config_dir, f"{vmid}.conf"), encoding="utf-8", errors="replace") as f:
            return parse_config(f.read())
    except FileNotFoundError:
        rc, out, _ = run([PCT, "config", str(vmid), "--current"])
        return parse_config(out) if rc == 0 else {}


def bind_mounts(config: dict[str, str]) -> list[tuple[str, str]]:
    """(node folder, mount point) of each mpN whose volume is a path on the node, in mpN order; storage
    volumes (`local:vm-..`) are the container's own, not the node's folders."""
    keys = sorted((int(m.group(1)), k) for k in config if (m := _MP_KEY.match(k)))
    out = []
    for _, key in keys:
        head, *options = [p.strip() for p in config[key].split(",")]
        props = dict(o.split("=", 1) for o in options if "=" in o)
        volume = head.split("=", 1)[1] if head.startswith("volume=") else head
        if volume.startswith("/") and props.get("mp", "").startswith("/"):
            out.append((os.path.normpath(volume), os.path.normpath(props["mp"])))
    return out


def mount_roots(mountinfo: str) -> dict[str, str]:
    """Mount point -> the folder of its filesystem mounted there, from a /proc/<pid>/mountinfo text (the
    last mount on a point is the one seen); a folder removed from under its mount ends in //deleted."""
    roots = {}
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) > 4:
            roots[_unescape(fields[4])] = _unescape(fields[3])
    return roots


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (a space is \\040) decoded."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def mount_differs(
    root: str | None, in_container: tuple[int, int] | str, on_node: tuple[int, int] | None
) -> str | None:
    """Why a running container's mount of a node folder is no longer that folder; None when it is, or when
    the container has nothing mounted there (`root` None: a mount point added since its start is a
    pending change, not a lost folder).

    root: the mount's folder in /proc/<pid>/mountinfo; in_container: (st_dev, st_ino) of the mount point
    seen through /proc/<pid>/root, or why it could not be read; on_node: (st_dev, st_ino) of the node's
    folder, None when the node has none."""
    if root is None:
        return None
    if root.endswith(_DELETED):
        return "was removed on the node while the container ran; the container still has the deleted folder"
    if isinstance(in_container, str):
        return f"cannot be read in the container ({in_container})"
    if on_node is None:
        return "is missing on the node; the container still has the folder that was there"
    if in_container != on_node:
        return "was replaced on the node while the container ran; the container still has the old one"
    return None


def _identity(path: str) -> tuple[int, int] | str:
    """(st_dev, st_ino) of `path`, following links; why not, when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError as e:
        return e.strerror or str(e)
    return st.st_dev, st.st_ino


def stale_mounts(
    vmids: list[int], run: Runner, proc: str = "/proc", config_dir: str = PVE_LXC_DIR
) -> list[dict[str, Any]]:
    """The bind mounts (mpN) of the given running containers whose node folder was removed or replaced
    since the container started, each {vmid, folder, mount_point, why}: the container keeps the folder it
    mounted at its start until it starts again. Stopped containers bind the node's folder at their start.
    Each also has a one-line `summary` naming the container, the folder and what happened to it."""
    found = []
    for vmid in vmids:
        pid = init_pid(vmid, run)
        mounts = bind_mounts(container_config(vmid, run, config_dir)) if pid else []
        if not mounts:
            continue
        try:
            with open(f"{proc}/{pid}/mountinfo", encoding="utf-8", errors="replace") as f:
                roots = mount_roots(f.read())
        except OSError:  # it stopped meanwhile: its next start binds the node's folders
            continue
        for folder, mount_point in mounts:
            node = _identity(folder)
            why = mount_differs(
                roots.get(mount_point),
                _identity(f"{proc}/{pid}/root{mount_point}"),
                node if isinstance(node, tuple) else None,
            )
            if why:
                said = f"CT {vmid}: {folder}, bound at {mount_point}, {why}"
                found.append(
                    {"vmid": vmid, "folder": folder, "mount_point": mount_point, "why": why, "summary": said}
                )
    return found


def read_node(
    run: Runner,
    gather: list[str] | tuple[str, ...] = GATHER,
    ostemplate: str = "",
    directories: list[dict[str, Any]] | None = None,
    paths: list[str] | None = None,
    containers: list[int] | None = None,
) -> dict[str, Any]:
    """Everything asked for, keyed for the role: one call, one dict. The node's commands (pveversion,
    nvidia-smi, pveam, the containers' LXC and PVE reads) run at the same time: none needs another's
    answer, and each costs from a tenth of a second to a second on a PVE node. A command's error is raised
    in the order they are listed here, as when they ran one after the other."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        version = pool.submit(pve_version, run) if "pve_version" in gather else None
        smi = pool.submit(gpus, run) if "gpus" in gather else None
        listing = pool.submit(templates, ostemplate.split(":", 1)[0], run) if ostemplate else None
        stale = pool.submit(stale_mounts, containers, run) if containers else None
        state: dict[str, Any] = {}
        if version is not None:
            state["pve_version"] = version.result()
        if "driver" in gather:
            state["driver_version"] = driver_version()
        if "devices" in gather:
            state["gpu_nodes"] = device_nodes()
        if smi is not None:
            state["gpus"], state["gpus_reason"] = smi.result()
        if listing is not None:
            listed = listing.result()
            state["templates"] = listed
            state["template_present"] = ostemplate in listed
        state["directories"] = {
            d["path"]: why for d in directories or [] if (why := directory_differs(d)) is not None
        }
        state["paths"] = {p: resolve(p) for p in paths or [] if p}
        if stale is not None:
            state["stale_mounts"] = stale.result()
    return state
