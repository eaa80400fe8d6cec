"""The cases: what each container gets (devN, mpN, privilege, user) and which doctor tier judges it.

    pass        every NVIDIA node as devN, driver libraries bound     -> the doctor's tier passes
    fault-node  /dev/nvidia-uvm (else the first node) without a devN  -> NVIDIA_UVM_MISSING
    fault-libs  the driver libraries not bound                 -> NVML_UNAVAILABLE or LIBCUDA_NOT_FOUND
    fault-perm  unprivileged, nodes gid=0 mode=0660, doctor as uid 1000 -> NVIDIA_NODE_PERMISSION

The devN/mpN values are written by the project's own filter (plugins/filter/container_options.py), so the
check proves the role's output, not a copy of it. The verdicts themselves are judged in report.py.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import types
from dataclasses import dataclass, field
from typing import Any

from .host import REPO, CannotRun, Host

# The doctor's sources and the stack profiles inside, laid out as in the checkout (verify/src beside
# profiles/), where the doctor finds the shipped profiles and policy it judges a stack by.
DOCTOR_MP = "/opt/mlstack/verify/src"
PROFILES_MP = "/opt/mlstack/profiles"
WRONG_GID = 0  # PVE's default gid when devN has none: root's group, which an ML user is not in
USER_UID, USER_GROUPS = 1000, "44"  # the non-root user inside: in `video` (44), as our devN gid assumes


@dataclass
class Case:
    """One container and its doctor run; log and result are filled while it runs and is judged."""

    name: str
    title: str
    vmid: int
    devs: dict[str, str]
    mps: dict[str, str]
    tier: str
    unprivileged: bool = False
    as_user: bool = False
    dropped: str | None = None  # the node left out (fault-node)
    expect: str = ""
    log: list[str] = field(default_factory=list)
    result: dict[str, Any] = field(default_factory=dict)


COLLECTION = "ansible_collections.mlstack.pve.plugins"


def load_filter() -> types.ModuleType:
    """The project's own devN/mpN filter (plugins/filter/container_options.py), with or without Ansible."""
    try:
        import ansible.errors
    except ImportError:
        ansible = types.ModuleType("ansible")
        errors = types.ModuleType("ansible.errors")
        errors.AnsibleFilterError = type("AnsibleFilterError", (Exception,), {})  # type: ignore[attr-defined]
        ansible.errors = errors  # type: ignore[attr-defined]
        sys.modules.setdefault("ansible", ansible)
        sys.modules.setdefault("ansible.errors", errors)
    # The filter reads `gpus` with the collection's module_utils/gpu_selection.py (standard library only):
    # loaded under its collection name, the import finds it without the collection being installed.
    _load(f"{COLLECTION}.module_utils.gpu_selection", "module_utils/gpu_selection.py")
    return _load("mlstack_container_options", "filter/container_options.py")


def _load(name: str, path: str) -> types.ModuleType:
    """A module of the checkout's plugins/ by its path, as `name`."""
    spec = importlib.util.spec_from_file_location(name, REPO / "plugins" / path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def build_cases(host: Host, args: argparse.Namespace, filt: types.ModuleType) -> list[Case]:
    """The cases asked for (--cases, default all), vmids from --vmid-base on in the order above."""
    devs = filt.device_options(host.nodes, "all", host.device_gid, host.device_mode)
    mounts = [{"host": str(REPO / "verify" / "src"), "ct": DOCTOR_MP, "ro": True}]
    mounts += [{"host": str(REPO / "profiles"), "ct": PROFILES_MP, "ro": True}]
    mounts += [{"host": m, "ct": m, "ro": True} for m in host.python_mounts]
    libs = [{"host": host.lib_dir, "ct": host.ct_lib_dir, "ro": True}] if host.lib_dir else []
    with_libs = filt.mount_options(mounts + libs)
    without_libs = filt.mount_options(mounts)
    base = args.vmid_base
    dropped = "/dev/nvidia-uvm" if "/dev/nvidia-uvm" in host.nodes else host.nodes[0]
    numbers = "{1}:{2}".format(*host.numbers[dropped])
    node_devs = filt.device_options(
        [n for n in host.nodes if n != dropped], "all", host.device_gid, host.device_mode
    )
    perm_devs = filt.device_options(host.nodes, "all", WRONG_GID, "0660")
    cases = [
        Case(
            "pass", "every NVIDIA node as devN, driver libraries bound", base, devs, with_libs, args.pass_tier
        ),
        Case(
            "fault-node",
            f"{dropped} not passed (no devN), so its {numbers} not allowed",
            base + 1,
            node_devs,
            with_libs,
            args.fault_tier,
            dropped=dropped,
        ),
        Case("fault-libs", "driver libraries not bound", base + 2, devs, without_libs, args.fault_tier),
        Case(
            "fault-perm",
            f"unprivileged, nodes gid={WRONG_GID} mode=0660, doctor as uid {USER_UID} (groups {USER_GROUPS})",
            base + 3,
            perm_devs,
            with_libs,
            args.fault_tier,
            unprivileged=True,
            as_user=True,
        ),
    ]
    wanted = args.cases.split(",") if args.cases else [c.name for c in cases]
    unknown = set(wanted) - {c.name for c in cases}
    if unknown:
        raise CannotRun(f"unknown case(s): {', '.join(sorted(unknown))}")
    return [c for c in cases if c.name in wanted]


def set_aside_uncheckable(cases: list[Case], host: Host) -> tuple[list[Case], list[Case]]:
    """(the cases to run, those not checkable here, already judged): without a driver there are no
    driver libraries to leave unbound, so fault-libs would prove nothing."""
    if host.gpu:
        return cases, []
    skipped = [c for c in cases if c.name == "fault-libs"]
    for c in skipped:
        c.result.update(
            case=c.name,
            vmid=c.vmid,
            title=c.title,
            verdict="not-checked",
            detail="no driver libraries on this host: nothing to leave unbound",
        )
    return [c for c in cases if c.name != "fault-libs"], skipped
