"""A model config transformers built with these very files: its stamp in the venv's Triton cache.

Outside a GPU session, `model_config` pays a worker's imports of torch, transformers and FLA (5-18 s of
CPU) to build the config on `meta`. The result depends only on what the worker reads, so the doctor
stamps a passed build under a key of all of it, in <TRITON_CACHE_DIR>/mlstack-config/<key>.json:

  the config file's bytes; the doctor's own files; the interpreter (its version, its binary's bytes);
  every file on the import path less the standard library (which dpkg's status and the interpreter
  cover): a file the venv shares with the node's uv store (a hard link) by inode, size, mtime and mode,
  a file of its own (the venv's .pth, the dist-info RECORDs) by its bytes and mode; the folders' modes
  and owners; the system's packages (dpkg's status); the uid and groups; the environment that steers
  imports; the resource limits

The cache of a stack is shared by the node's containers of that stack (the ml_venv role), and their
venvs are hard links into one store: the second container of a node finds the stamp of the first and
skips the worker. A file changed, replaced, removed or unreadable changes the key: the config is built
again. Failures are never stamped. Removing the folder forces a build. A venv whose torch or transformers
no import compiled yet builds anyway: its imports compile the bytecode training then finds.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import stat
import sys
from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mlstack_doctor.files import read_json_object, sha256_of, write_atomic
from mlstack_doctor.reuse import STEERING_ENV, doctor_lines

RECIPE = 1  # bump when what the key covers or what the build checks changes: every stamp is then stale
STAMP_DIR = "mlstack-config"
# A file of the venv's own (one link) is keyed by its bytes up to these sizes, else by its inode and mtime.
HASH_FILE_MAX = 2 << 20
HASH_TOTAL_MAX = 16 << 20
# An import path this large (a PYTHONPATH over a dataset) is not keyed: the config is built every time.
ENTRIES_MAX = 200_000
LIMITS = ("RLIMIT_AS", "RLIMIT_DATA", "RLIMIT_NOFILE", "RLIMIT_STACK", "RLIMIT_NPROC")
CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
DPKG_STATUS = "/var/lib/dpkg/status"
# The build's big imports, whose compiled bytecode a venv should hold before a stamp stands in for a build.
COMPILED = ("torch", "transformers")


class TooLarge(Exception):
    """The import path holds more than ENTRIES_MAX entries."""


class _Walk:
    """Lines naming every folder, file and link under the roots, in a stable order."""

    def __init__(self) -> None:
        self.hashed = 0
        self.entries = 0
        self.lines: list[str] = []

    def _count(self, label: str) -> None:
        self.entries += 1
        if self.entries > ENTRIES_MAX:
            raise TooLarge(label)

    def file(self, path: str, label: str, st: os.stat_result) -> None:
        self._count(label)
        owner = f"{st.st_mode:o}:{st.st_uid}:{st.st_gid}"
        if stat.S_ISLNK(st.st_mode):
            self.lines.append(f"{label}:L:{os.readlink(path)}")
        elif st.st_nlink == 1 and st.st_size <= HASH_FILE_MAX and self.hashed + st.st_size <= HASH_TOTAL_MAX:
            try:
                self.lines.append(f"{label}:H:{sha256_of(path)}:{owner}")
                self.hashed += st.st_size
            except OSError as exc:
                self.lines.append(f"{label}:unreadable:{exc.errno}:{owner}")
        else:
            self.lines.append(f"{label}:S:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}:{owner}")

    def tree(self, root: str, name: str, rel: str = "") -> None:
        """A folder's entries, depth first in name order, labelled `name` (the root's place on the import
        path, not its path: a venv reached through another folder holds the same files) and `rel`."""
        path = os.path.join(root, rel) if rel else root
        try:
            with os.scandir(path) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            self.lines.append(f"{name}|{rel}/:unreadable:{exc.errno}")
            return
        for entry in entries:
            # The doctor's package and its dist-info or egg-info: doctor_lines has its files.
            if entry.name == "__pycache__" or entry.name.startswith("mlstack_doctor"):
                continue
            sub = f"{rel}/{entry.name}" if rel else entry.name
            label = f"{name}|{sub}"
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError as exc:
                self.lines.append(f"{label}:missing:{exc.errno}")
                continue
            if stat.S_ISDIR(st.st_mode):
                self._count(label)
                self.lines.append(f"{label}/:D:{st.st_mode:o}:{st.st_uid}:{st.st_gid}")
                self.tree(root, name, sub)
            else:
                self.file(entry.path, label, st)


def import_roots() -> list[str]:
    """What the worker imports from and the interpreter's version and the system's packages do not cover:
    this interpreter's path less the standard library (below sys.base_prefix, outside a venv's prefix) and
    less its first entry, the entry point's folder (the worker's own is the doctor's, and `python -m` puts
    the working folder there)."""
    base, prefix = os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)
    roots = []
    for p in sys.path[1:]:
        real = os.path.realpath(p) if p else ""
        stdlib = real.startswith(base + os.sep) and not (prefix != base and real.startswith(prefix + os.sep))
        if real and not stdlib:
            roots.append(os.path.abspath(p))
    return roots


def _limits() -> list[str]:
    lines = [f"limit.{name}={resource.getrlimit(getattr(resource, name))}" for name in LIMITS]
    for path in CGROUP_LIMITS:
        try:
            lines.append(f"cgroup.{path}={Path(path).read_text().strip()}")
        except OSError:
            pass
    return lines


def key(config: str | Path, roots: Iterable[str] | None = None) -> str | None:
    """The stamp's key for building `config` in this process's place; None where it cannot be keyed."""
    walk = _Walk()
    try:
        walk.lines.append(f"config={sha256_of(config)}")
        # By its bytes: each container's root filesystem has its own copy of the same binary.
        interpreter = os.path.realpath(sys.executable)
        walk.lines.append(f"interpreter={interpreter}:{sha256_of(interpreter)}")
        if os.path.isfile(DPKG_STATUS):
            walk.lines.append(f"dpkg={sha256_of(DPKG_STATUS)}")
        for i, root in enumerate(import_roots() if roots is None else roots):
            if os.path.isdir(root):
                walk.tree(root, f"path{i}")
            elif os.path.lexists(root):  # a zip on the path
                walk.file(root, f"path{i}", os.lstat(root))
    except (TooLarge, OSError):
        return None
    lines = [
        f"recipe={RECIPE}",
        f"python={sys.version}",
        *doctor_lines(),
        f"uid={os.getuid()}:{os.getgid()}:{sorted(os.getgroups())}",
        *(f"env.{var}={os.environ.get(var, '')}" for var in STEERING_ENV),
        *_limits(),
        *walk.lines,
    ]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:24]


def uncompiled(roots: Iterable[str] | None = None) -> list[str]:
    """The packages of COMPILED on the import path whose bytecode nobody wrote yet. A build imports them
    and so compiles it (as root, into the venv), which training's later imports use; a stamp would leave
    a venv that no import compiled, and no sibling venv lent bytecode to (mlstack-build-venv), without it."""
    tag = sys.implementation.cache_tag
    missing = []
    for package in COMPILED:
        for root in import_roots() if roots is None else roots:
            if os.path.isfile(os.path.join(root, package, "__init__.py")):
                if not os.path.isfile(os.path.join(root, package, "__pycache__", f"__init__.{tag}.pyc")):
                    missing.append(package)
                break
    return missing


def stamp_path(cache_dir: str | Path, key: str) -> Path:
    return Path(cache_dir) / STAMP_DIR / f"{key}.json"


def read(cache_dir: str | Path, key: str) -> dict[str, Any] | None:
    """The stamp of `key`: {'built', 'host', 'data'}, or None."""
    stamp = read_json_object(stamp_path(cache_dir, key))
    if stamp is None or stamp.get("key") != key or stamp.get("recipe") != RECIPE:
        return None
    return stamp if isinstance(stamp.get("data"), dict) else None


def write(cache_dir: str | Path, key: str, data: dict[str, Any]) -> Path:
    """Stamp a passed build of `key` (OSError where the cache is not writable here)."""
    stamp = {
        "key": key,
        "recipe": RECIPE,
        "built": datetime.now(UTC).isoformat(timespec="seconds"),
        "host": os.uname().nodename,
        "data": data,
    }
    return write_atomic(stamp_path(cache_dir, key), json.dumps(stamp, indent=1, sort_keys=True) + "\n")
