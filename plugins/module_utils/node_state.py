"""Reading what the pve_host role checks and manages on a PVE node, in one pass: the PVE version, the
NVIDIA kernel module, the NVIDIA device nodes, the GPUs nvidia-smi lists, the templates on a storage,
the shared directories and where paths really lead. The role then runs a changing task only for what
differs, so a rerun on an unchanged node costs one round trip.

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
from typing import Any

from ansible_collections.mlstack.pve.plugins.module_utils.stack_policy import parse_nvidia_smi_csv

Runner = Callable[[list[str]], tuple[int, str, str]]

DRIVER_FILE = "/proc/driver/nvidia/version"
_DRIVER = re.compile(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)")
_PVE = re.compile(r"pve-manager/([0-9.]+)")
NVIDIA_SMI = ["nvidia-smi", "--query-gpu=index,name,uuid,compute_cap", "--format=csv,noheader"]
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
            m = _DRIVER.search(f.read())
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


def read_node(
    run: Runner,
    gather: list[str] | tuple[str, ...] = GATHER,
    ostemplate: str = "",
    directories: list[dict[str, Any]] | None = None,
    paths: list[str] | None = None,
) -> dict[str, Any]:
    """Everything asked for, keyed for the role: one call, one dict."""
    state: dict[str, Any] = {}
    if "pve_version" in gather:
        state["pve_version"] = pve_version(run)
    if "driver" in gather:
        state["driver_version"] = driver_version()
    if "devices" in gather:
        state["gpu_nodes"] = device_nodes()
    if "gpus" in gather:
        state["gpus"], state["gpus_reason"] = gpus(run)
    if ostemplate:
        listed = templates(ostemplate.split(":", 1)[0], run)
        state["templates"] = listed
        state["template_present"] = ostemplate in listed
    state["directories"] = {
        d["path"]: why for d in directories or [] if (why := directory_differs(d)) is not None
    }
    state["paths"] = {p: resolve(p) for p in paths or [] if p}
    return state
