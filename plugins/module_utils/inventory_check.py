"""The inventory's checks, each returning the messages a user reads (what is wrong and what to fix), in
the order a user would fix them. Nothing here reads the node or the API: the caller reads them once and
passes what it found.

They run in groups (CHECKS, by name), as their inputs become known: the containers' entries before any
role runs (`entries`: inventory_entries, one line per mistake), then in the gpu_container preflight the
inventory's own values (before the stack policy chooses), the chosen stacks against the profiles, the
node's GPUs and paths, and the guests the API listed.

Controller only (the inventory_check action): the entries' settings are ct_table's rows, the `gpus`
selection is read by gpu_selection, the paths by preflight, as the filters read them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from typing import Any

import yaml
from ansible_collections.mlstack.pve.plugins.module_utils import gpu_selection, inventory_entries
from ansible_collections.mlstack.pve.plugins.module_utils.ct_settings import CREATE_DEFAULTS
from ansible_collections.mlstack.pve.plugins.module_utils.ct_table import TAG
from ansible_collections.mlstack.pve.plugins.module_utils.preflight import path_within
from ansible_collections.mlstack.pve.plugins.module_utils.stack_facts import list_profiles

_DNS_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,61}[A-Za-z0-9])?$")
_PVE_ID = re.compile(r"^[A-Za-z][A-Za-z0-9._-]*$")
VOLID = re.compile(r"^[A-Za-z][A-Za-z0-9._-]*:vztmpl/[A-Za-z0-9._+-]+$")
_TOKEN_ID = re.compile(r"^([^\s!:/@]+@[A-Za-z][A-Za-z0-9._-]*!)?[A-Za-z][A-Za-z0-9._-]+$")
_UV_ERROR = re.compile(r"error: [^\n]*")


def _as_int(value: Any) -> int:
    """As Jinja's `int` filter: 0 for what is not a number."""
    try:
        return int(str(value).strip())
    except ValueError:
        return 0


def node_settings(host: str, settings: dict[str, Any]) -> list[str]:
    """Names that reach the API and the node in PVE's own formats (no shell metacharacter gets that far)."""
    bad = [
        what
        for what, pattern, value in (
            ("node name (mlstack_pve_node) a DNS name", _DNS_NAME, "node"),
            ("rootfs storage (mlstack_rootfs_storage) a PVE storage id", _PVE_ID, "storage"),
            ("bridge (mlstack_bridge) an interface name", _PVE_ID, "bridge"),
            ("template (mlstack_ostemplate) a volid storage:vztmpl/file", VOLID, "ostemplate"),
            ("tag (gpu_container_tag) of a-z, 0-9, . _ -", TAG, "tag"),
        )
        if not pattern.match(str(settings.get(value, "")))
    ]
    if not bad:
        return []
    return [f"{host}: expected {'; '.join(bad)}, of letters, digits and . _ - only. Fix the inventory."]


def token_settings(host: str, token_id: str, secret_set: bool) -> list[str]:
    """A token id PVE would take, and a secret for it (which is never printed)."""
    if not token_id:
        return []
    bad = []
    if not _TOKEN_ID.match(token_id):
        bad.append(
            "mlstack_pve_api_token_id must be user@realm!name (or only the name, with the user in"
            " mlstack_pve_api_user)"
        )
    if not secret_set:
        bad.append("mlstack_pve_api_token_secret is empty (put the secret PVE showed once in vault)")
    if not bad:
        return []
    return [f"{host}: the API token settings are incomplete: {'; '.join(bad)}. Fix the inventory."]


def container_fields(host: str, containers: list[dict[str, Any]]) -> list[str]:
    """Each entry's own values, as its settings take them (ct_table), its `gpus` read as every reading of
    it does (gpu_selection)."""
    return [
        line
        for i, c in enumerate(containers)
        for line in inventory_entries.values(inventory_entries.name(host, c, i), c)
    ]


def known_profiles(profiles_dir: str) -> list[str]:
    try:
        return list_profiles(profiles_dir)
    except OSError:
        return []


def profiles_exist(containers: list[dict[str, Any]], profiles_dir: str) -> list[str]:
    """A profile named in the inventory is one of the stack profiles (stack_facts.list_profiles)."""
    try:
        known = known_profiles(profiles_dir)
    except ValueError as e:
        return [f"{e}."]
    return [
        f"Container {c['vmid']}: unknown profile '{c['profile']}'. Known profiles: {', '.join(known)}."
        for c in containers
        if c.get("profile") and str(c["profile"]) not in known
    ]


def resources(containers: list[dict[str, Any]], choices: dict[str, Any], profiles_dir: str) -> list[str]:
    """Each container's memory and disk against what its chosen profile needs (profile.yml)."""
    out = []
    for c in containers:
        profile = choices[str(c["vmid"])]["profile"]
        try:
            with open(os.path.join(profiles_dir, profile, "profile.yml"), encoding="utf-8") as f:
                needs = yaml.safe_load(f) or {}
        except FileNotFoundError:
            needs = {}
        c = {"memory_mb": CREATE_DEFAULTS["memory_mb"], "disk_gb": CREATE_DEFAULTS["disk_gb"], **c}
        memory, disk = _as_int(c["memory_mb"]), _as_int(c["disk_gb"])
        min_memory, min_disk = needs.get("min_memory_mb", 0), needs.get("min_disk_gb", 0)
        if memory < _as_int(min_memory) or disk < _as_int(min_disk):
            out.append(
                f"Container {c['vmid']}: profile {profile} needs at least {min_memory} MiB of memory and"
                f" {min_disk} GiB of disk (profiles/{profile}/profile.yml), but the inventory gives memory_mb"
                f" {c['memory_mb']} and disk_gb {c['disk_gb']}. Raise them in the inventory"
                " entry."
            )
    return out


def lock_results(
    uv: str, profiles_dir: str, profiles: list[str], run: Callable[[list[str]], tuple[int, str, str]]
) -> dict[str, dict[str, Any]]:
    """`uv lock --check` of each profile, run on the controller: {profile: {rc, stdout, stderr}}, as
    `locks` reads them."""
    out: dict[str, dict[str, Any]] = {}
    for profile in dict.fromkeys(profiles):
        rc, stdout, stderr = run([uv, "lock", "--check", "--project", f"{profiles_dir}/{profile}"])
        out[profile] = {"rc": rc, "stdout": stdout, "stderr": stderr}
    return out


def locks(results: dict[str, dict[str, Any]]) -> list[str]:
    """`uv lock --check` per profile (its command result): a lock behind its pyproject, or not checked."""
    out = []
    for profile, r in results.items():
        if r.get("skipped") or r.get("rc") == 0:
            continue
        said = ((r.get("stderr") or "") or (r.get("msg") or "")).strip()
        m = _UV_ERROR.search(said)
        out.append(
            f"Profile {profile}: `uv lock --check` says its uv.lock is out of date with its pyproject.toml,"
            f" or could not check it: {m.group(0) if m else (said.splitlines() or [''])[-1]} Refresh the lock"
            f" on the controller with `uv lock --project profiles/{profile}`, commit pyproject.toml and"
            " uv.lock together, and rerun."
        )
    return out


def unique(host: str, inventory: dict[str, Any]) -> list[str]:
    """The node's entries whose vmid or hostname another entry of the inventory (any node) has too."""
    entries = inventory.get(host) or []
    return [
        line
        for i, c in enumerate(entries)
        if isinstance(c, dict)
        for line in inventory_entries.overlaps(host, i, c, inventory)
    ]


def entries(
    host: str, containers: Any, inventory: dict[str, Any] | None, gpu_nodes: list[str] | None
) -> list[str]:
    """Every mistake of the node's entries (inventory_entries), one line each: run before any role."""
    return inventory_entries.mistakes(host, containers, inventory, gpu_nodes)


def gpu_selections(host: str, containers: list[dict[str, Any]], gpu_nodes: list[str]) -> list[str]:
    """Each container's `gpus` against the node's device nodes (all, none or indices it has)."""
    out = []
    for c in containers:
        try:
            gpu_selection.select_nodes(gpu_nodes, c.get("gpus", gpu_selection.DEFAULT))
        except gpu_selection.SelectionError as e:
            out.append(f"Container {c.get('vmid')} on {host}: {e}")
    return out


def bind_sources(
    host: str,
    containers: list[dict[str, Any]],
    caches: list[str],
    resolved: dict[str, dict[str, Any]],
    roots: list[str],
) -> list[str]:
    """Model paths and the shared caches, as resolved on the node: present (models) and below the roots."""
    out = []
    within = f"outside the folders that may be bind-mounted into containers ({', '.join(map(str, roots))})."
    for c in containers:
        path = c.get("model_path") or ""
        if not path:
            continue
        real = resolved.get(path, {})
        if not real.get("exists"):
            out.append(
                f"Container {c['vmid']}: model_path {path} does not exist on {host}. Copy the model there or"
                " fix the path."
            )
        elif not path_within(real.get("real", ""), roots):
            out.append(
                f"Container {c['vmid']}: model_path {path} is {real['real']} on {host}, {within} Move the"
                " model below one of them, or add its folder to gpu_container_mount_roots if it really is"
                " meant to be shared."
            )
    for cache in caches:
        real = resolved.get(cache, {}).get("real", "?")
        if not path_within(real, roots):
            out.append(
                f"The shared cache {cache} is {real} on {host}, {within} Put the caches below pve_host_root"
                " (/var/lib/mlstack)."
            )
    return out


def foreign_vmids(
    containers: list[dict[str, Any]], guests: list[dict[str, Any]], ours: list[int], tag: str
) -> list[str]:
    """An inventory vmid that a guest without this project's tag already uses."""
    wanted = {_as_int(c.get("vmid")) for c in containers}
    return [
        f"vmid {g['vmid']} is already used by {g.get('type')} '{g.get('name', '')}' on node {g.get('node')},"
        f" which this project did not create (no '{tag}' tag). Choose a free vmid."
        for g in guests
        if g.get("vmid") in wanted and g.get("vmid") not in ours
    ]


def missing_passthrough_message(host: str, missing: list[dict[str, Any]]) -> list[str]:
    """devN nodes of our containers that the node lacks: PVE would refuse to start them."""
    if not missing:
        return []
    named = " ".join(
        f"CT {m['vmid']} passes {m['path']} through ({m['key']}), but node {host} has no {m['path']}."
        for m in missing
    )
    return [
        f'{named} PVE would refuse to start it ("Device ... does not exist"). Fix the node:'
        " `nvidia-smi` must list every GPU (reload the NVIDIA driver or reboot the node), and"
        " `nvidia-modprobe -u -c=0` recreates /dev/nvidia-uvm*. If a GPU is gone for good, list the GPUs"
        " left in the container's gpus. Then rerun."
    ]


Check = Callable[[dict[str, Any]], list[str]]
# Every check by name, the inputs it needs (the action refuses a named check without them) and how it is
# called on the action's arguments. A caller names the checks it runs: none is picked by what is given.
CHECKS: dict[str, tuple[tuple[str, ...], Check]] = {
    "node_settings": (("settings",), lambda a: node_settings(a["host"], a["settings"])),
    "token_settings": (
        ("settings",),
        lambda a: token_settings(
            a["host"], str(a["settings"].get("token_id", "")), bool(a["settings"].get("token_secret_set"))
        ),
    ),
    "container_fields": (("containers",), lambda a: container_fields(a["host"], a["containers"])),
    "profiles_exist": (
        ("containers", "profiles_dir"),
        lambda a: profiles_exist(a["containers"], a["profiles_dir"]),
    ),
    "resources": (
        ("containers", "choices", "profiles_dir"),
        lambda a: resources(a["containers"], a["choices"], a["profiles_dir"]),
    ),
    "locks": (("locks",), lambda a: locks(a["locks"])),
    "gpu_selections": (
        ("containers", "gpu_nodes"),
        lambda a: gpu_selections(a["host"], a["containers"], a["gpu_nodes"]),
    ),
    "unique": (("inventory",), lambda a: unique(a["host"], a["inventory"])),
    "bind_sources": (
        ("containers", "resolved", "mount_roots"),
        lambda a: bind_sources(
            a["host"], a["containers"], a.get("caches") or [], a["resolved"], a["mount_roots"]
        ),
    ),
    "foreign_vmids": (
        ("containers", "guests", "ours"),
        lambda a: foreign_vmids(a["containers"], a["guests"], a["ours"], a["tag"]),
    ),
    "missing_passthrough": (
        ("missing_nodes",),
        lambda a: missing_passthrough_message(a["host"], a["missing_nodes"]),
    ),
    # Optional inputs: `inventory` (vmids and hostnames across nodes), `gpu_nodes` (GPUs the node lacks).
    "entries": (
        ("containers",),
        lambda a: entries(a["host"], a["containers"], a.get("inventory"), a.get("gpu_nodes")),
    ),
}


def run_checks(names: list[str], args: dict[str, Any]) -> list[str]:
    """The messages of the named checks, in the order named; ValueError for a name that is no check or a
    check whose inputs are not given (a caller's mistake, not the inventory's)."""
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check(s) {', '.join(unknown)}; the checks: {', '.join(CHECKS)}")
    errors: list[str] = []
    for name in names:
        needs, check = CHECKS[name]
        missing = [n for n in needs if args.get(n) is None]
        if missing:
            raise ValueError(f"check {name} needs {', '.join(missing)}")
        errors += check(args)
    return errors
