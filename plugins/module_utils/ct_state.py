"""Reading what a role manages inside a container, in one pass: files, folders, links, dpkg packages, a
tool's version, the driver userspace's libcuda, a locked venv and an installed distribution. Each check
returns what it found and, when the state is not the wanted one, why; the roles run a mutating task only
for an item that differs.

Nothing here changes anything, and every check fails closed: what cannot be read differs.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import subprocess
from collections.abc import Callable
from typing import Any

from ansible_collections.mlstack.pve.plugins.module_utils.libcuda_facts import cached_version, ldconfig_argv

# Top-level entries of site-packages a venv's manifest leaves out: bytecode Python writes there at run
# time, and the doctor, which its own role installs into the venv after the build (and checks itself).
MANIFEST_IGNORED = re.compile(r"^(__pycache__|mlstack_doctor|mlstack_doctor-[^/]*\.dist-info)$")
MANIFEST = ".mlstack-manifest"
MARKER = ".mlstack-complete"
# dpkg names only: a version or an architecture qualifier is apt's to resolve, so it is never "present".
DPKG_NAME = re.compile(r"^[a-z0-9][a-z0-9+.-]+$")

Found = tuple[Any, str | None]  # (what was found, why it differs or None)


def sha1_of(path: str) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _owner_mode(st: os.stat_result, item: dict[str, Any]) -> str | None:
    if item.get("mode") and stat.S_IMODE(st.st_mode) != int(str(item["mode"]), 8):
        return f"mode {stat.S_IMODE(st.st_mode):04o}, not {item['mode']}"
    if (item.get("owner") == "root" and st.st_uid != 0) or (item.get("group") == "root" and st.st_gid != 0):
        return f"owned by {st.st_uid}:{st.st_gid}, not root"
    return None


def check_file(item: dict[str, Any]) -> Found:
    path = item["path"]
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None, "missing"
    if not stat.S_ISREG(st.st_mode):
        return None, "not a regular file"
    found = sha1_of(path)
    if item.get("sha1") and found != item["sha1"]:
        return found, "content differs"
    return found, _owner_mode(st, item)


def check_directory(item: dict[str, Any]) -> Found:
    try:
        st = os.lstat(item["path"])
    except FileNotFoundError:
        return None, "missing"
    if not stat.S_ISDIR(st.st_mode):
        return None, "not a directory"
    return item["path"], _owner_mode(st, item)


def check_link(item: dict[str, Any]) -> Found:
    """A symlink and its target as written (what ansible.builtin.stat calls lnk_source when absolute).
    Without `src` it is only read: no link is then no difference."""
    path = item["path"]
    if not os.path.islink(path):
        if not item.get("src"):
            return None, None
        return None, "missing" if not os.path.lexists(path) else "not a symlink"
    target = os.readlink(path)
    if item.get("src") and target != item["src"]:
        return target, f"points at {target}"
    return target, None


def check_packages(item: dict[str, Any], run: Callable[[list[str]], tuple[int, str, str]]) -> Found:
    names = list(item["names"])
    odd = [n for n in names if not DPKG_NAME.match(n)]
    plain = [n for n in names if DPKG_NAME.match(n)]
    status: dict[str, str] = {}
    if plain:
        # Exit 1 when a name is unknown to dpkg: the others are still listed.
        _, out, _ = run(["dpkg-query", "-W", "-f=${Package}\t${db:Status-Abbrev}\n", "--", *plain])
        for line in out.splitlines():
            name, _, abbrev = line.partition("\t")
            status[name.split(":")[0]] = abbrev.strip()
    missing = [n for n in plain if not status.get(n, "").startswith("ii")]
    if missing or odd:
        why = ", ".join(
            ([f"not installed: {' '.join(missing)}"] if missing else [])
            + ([f"not checked (apt resolves them): {' '.join(odd)}"] if odd else [])
        )
        return missing + odd, why
    return [], None


def check_version(item: dict[str, Any], run: Callable[[list[str]], tuple[int, str, str]]) -> Found:
    """`argv` prints `expect` or `expect <more>` (as `uv --version` prints `uv 0.13.9 (hash date)`)."""
    rc, out, _ = run(list(item["argv"]))
    said = out.strip().splitlines()[0] if out.strip() else ""
    if rc != 0:
        return None, "missing" if rc == 127 else f"exit {rc}"
    if said != item["expect"] and not said.startswith(item["expect"] + " "):
        return said, f"is {said or 'silent'}"
    return said, None


def check_libcuda(item: dict[str, Any], run: Callable[[list[str]], tuple[int, str, str]]) -> Found:
    """libcuda's version as the linker cache resolves it (libcuda_facts.cached_version); against
    `version` when given. Without `version` it is only read: no libcuda is then no difference."""
    argv = ldconfig_argv()
    rc, out, err = run(argv)
    if rc != 0:
        return None, f"{' '.join(argv)} exited {rc}: {(err or out).strip() or 'no output'}"
    found = cached_version(out)
    if item.get("version") and found != item["version"]:
        return found, f"is {found}" if found else "missing"
    return found, None


def site_packages(venv: str) -> str | None:
    lib = os.path.join(venv, "lib")
    try:
        pythons = sorted(n for n in os.listdir(lib) if n.startswith("python3"))
    except OSError:
        return None
    return os.path.join(lib, pythons[0], "site-packages") if len(pythons) == 1 else None


def manifest_lines(site: str) -> list[str]:
    """What the builder records after `uv sync`: site-packages' top-level names, byte order."""
    return sorted((n for n in os.listdir(site) if not MANIFEST_IGNORED.match(n)), key=os.fsencode)


def marker_ok(marker: str) -> bool:
    """`sha256sum --status -c MARKER`: every listed file exists with the recorded hash."""
    try:
        with open(marker, encoding="utf-8") as f:
            lines = [line.rstrip("\n") for line in f if line.strip()]
    except OSError:
        return False
    for line in lines:
        digest, _, path = line.partition("  ")
        try:
            with open(path, "rb") as f:
                if hashlib.sha256(f.read()).hexdigest() != digest:
                    return False
        except OSError:
            return False
    return bool(lines)


def check_venv(item: dict[str, Any]) -> Found:
    """A venv the builder completed (marker: the lock it was built from, unchanged), whose installed
    top-level names are still those the build left (a pip install over it, or a removed package,
    changes them). File contents inside packages are not hashed: too slow for every run."""
    venv = item["path"]
    if not os.path.isdir(venv):
        return None, "missing"
    if not marker_ok(os.path.join(venv, MARKER)):
        return None, "incomplete (no completion marker for its lock)"
    site = site_packages(venv)
    try:
        with open(os.path.join(venv, MANIFEST), encoding="utf-8") as f:
            recorded = f.read().splitlines()
    except OSError:
        return None, "built without a manifest of its packages: it cannot be checked"
    if site is None or not os.path.isdir(site):
        return None, "has no site-packages"
    now = manifest_lines(site)
    if now != recorded:
        added, gone = sorted(set(now) - set(recorded)), sorted(set(recorded) - set(now))
        return {"added": added, "gone": gone}, (
            "changed since its build:"
            + (f" added {' '.join(added[:6])}{' ...' if len(added) > 6 else ''}" if added else "")
            + (f" gone {' '.join(gone[:6])}{' ...' if len(gone) > 6 else ''}" if gone else "")
        )
    return venv, None


def check_dist(item: dict[str, Any]) -> Found:
    """A distribution installed in a venv at a version (its NAME-VERSION.dist-info)."""
    site = site_packages(item["venv"])
    if site is None:
        return None, "no venv"
    prefix = item["name"] + "-"
    versions = sorted(
        n[len(prefix) : -len(".dist-info")]
        for n in os.listdir(site)
        if n.startswith(prefix) and n.endswith(".dist-info")
    )
    if not versions:
        return None, "not installed"
    if item.get("version") and versions != [item["version"]]:
        return versions, f"installed {' '.join(versions)}, not {item['version']}"
    return versions, None


def check_subdirs(item: dict[str, Any]) -> Found:
    """Not a check: the folders under a path (the venvs a prune considers), never differing."""
    path = item["path"]
    try:
        names = sorted(os.listdir(path))
    except OSError:
        return [], None
    return [os.path.join(path, n) for n in names if os.path.isdir(os.path.join(path, n))], None


def check_free(item: dict[str, Any]) -> Found:
    """Not a check of state: the bytes free where a step writes (`paths`: {path: bytes it needs}), the needs
    of paths on one filesystem added up. Found: {free: {path: bytes}, short: [{path, free, need}]}, the
    first folder of each filesystem that lacks what the step needs; never differing (a role stops on it
    only when it has something to write). A path not there yet is measured at its nearest existing folder."""
    free: dict[str, int] = {}
    by_fs: dict[int, list[tuple[str, int]]] = {}
    for path, need in item["paths"].items():
        where = str(path)
        while not os.path.exists(where) and where not in ("", "/"):
            where = os.path.dirname(where.rstrip("/")) or "/"
        st = os.statvfs(where)
        free[path] = st.f_bavail * st.f_frsize
        by_fs.setdefault(os.stat(where).st_dev, []).append((path, int(need)))
    short = []
    for paths in by_fs.values():
        need = sum(n for _, n in paths)
        if free[paths[0][0]] < need:
            short.append({"path": " and ".join(p for p, _ in paths), "free": free[paths[0][0]], "need": need})
    return {"free": free, "short": short}, None


def check_dpkg_audit(item: dict[str, Any], run: Callable[[list[str]], tuple[int, str, str]]) -> Found:
    """What an interrupted dpkg left half-done (`dpkg --audit` lists it; nothing when all is well): the
    package names it lists."""
    _, out, _ = run(["dpkg", "--audit"])
    if not out.strip():
        return [], None
    names = re.findall(r"(?m)^ (\S+)\s", out)
    return names, f"left half-done by an interrupted dpkg: {' '.join(names) or out.strip().splitlines()[0]}"


def _run(argv: list[str]) -> tuple[int, str, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except FileNotFoundError:
        return 127, "", f"{argv[0]}: not found"
    except subprocess.TimeoutExpired:
        return 124, "", f"{argv[0]}: timed out"
    return p.returncode, p.stdout, p.stderr


CHECKS: dict[str, Callable[..., Found]] = {
    "file": check_file,
    "directory": check_directory,
    "link": check_link,
    "venv": check_venv,
    "dist": check_dist,
    "subdirs": check_subdirs,
    "free": check_free,
}
COMMAND_CHECKS = {
    "dpkg_audit": check_dpkg_audit,
    "packages": check_packages,
    "version": check_version,
    "libcuda": check_libcuda,
}


def read_state(
    items: dict[str, dict[str, Any]], run: Callable[[list[str]], tuple[int, str, str]] = _run
) -> dict[str, Any]:
    """{found: {key: value}, differs: {key: why}} for every item, keyed as given."""
    found: dict[str, Any] = {}
    differs: dict[str, str] = {}
    for key, item in items.items():
        kind = item.get("type", "")
        try:
            if kind in COMMAND_CHECKS:
                value, why = COMMAND_CHECKS[kind](item, run)
            elif kind in CHECKS:
                value, why = CHECKS[kind](item)
            else:
                value, why = None, f"unknown check type {kind!r}"
        except OSError as e:
            value, why = None, f"unreadable: {e.strerror or e}"
        found[key] = value
        if why:
            differs[key] = why
    return {"found": found, "differs": differs}
