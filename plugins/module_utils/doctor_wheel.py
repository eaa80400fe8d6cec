"""The doctor's wheel on the controller: built from verify/ only when its sources differ from those of the
wheel already there (their checksum is kept beside it), then found, checksummed and named by version. One
in-process step replaces a check for uv, a build, a stamp and a search: a rerun builds nothing."""

from __future__ import annotations

import glob
import hashlib
import os
from collections.abc import Callable
from typing import Any

Runner = Callable[[list[str], dict[str, str]], tuple[int, str, str]]
STAMP = "mlstack_doctor.src-sha1"
PATTERN = "mlstack_doctor-*.whl"
# What the wheel is built from, relative to the doctor's source folder; caches are left out. Its README is
# not in the wheel: a change of the docs alone installs nothing new in the containers and nodes.
SOURCES = ("pyproject.toml", "src")
PRUNED = ("__pycache__",)
# A reproducible wheel (fixed timestamps), so an unchanged doctor copies as unchanged. The build backend
# comes from the index: trust the system's CA store (TLS-intercepting proxies).
BUILD_ENV = {"SOURCE_DATE_EPOCH": "315532800", "UV_SYSTEM_CERTS": "1"}


def _sha1_file(path: str) -> str:
    digest = hashlib.sha1()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def source_files(src: str) -> list[str]:
    """The files the wheel is built from, relative to `src`, in byte order."""
    found: list[str] = []
    for top in SOURCES:
        path = os.path.join(src, top)
        if os.path.isfile(path):
            found.append(top)
            continue
        for root, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if d not in PRUNED and not d.endswith(".egg-info")]
            rel = os.path.relpath(root, src)
            found += [os.path.join(rel, f) for f in files if os.path.isfile(os.path.join(root, f))]
    return sorted(found, key=os.fsencode)


def source_sha1(src: str) -> str:
    """One checksum of the sources: the sha1 of `sha1sum` lines of every file, in byte order."""
    lines = "".join(f"{_sha1_file(os.path.join(src, rel))}  {rel}\n" for rel in source_files(src))
    return hashlib.sha1(lines.encode()).hexdigest()


def wheels(dist_dir: str) -> list[str]:
    return sorted(glob.glob(os.path.join(glob.escape(dist_dir), PATTERN)))


def read_stamp(dist_dir: str) -> str:
    try:
        with open(os.path.join(dist_dir, STAMP), encoding="utf-8") as f:
            return f.read().strip()
    except OSError:
        return ""


def ensure_wheel(uv: str, src: str, dist_dir: str, run: Runner) -> dict[str, Any]:
    """Build the wheel where none is there or the sources changed since; return the newest wheel's path,
    sha1 and version, and whether it was built. Raises ValueError with what to fix."""
    sources = source_sha1(src)
    built = False
    if not wheels(dist_dir) or read_stamp(dist_dir) != sources:
        argv = [uv, "build", "--quiet", "--wheel", "--out-dir", dist_dir, src]
        rc, out, err = run(argv, BUILD_ENV)
        if rc != 0:
            raise ValueError(f"{' '.join(argv)} exited {rc}: {(err or out).strip() or 'no output'}")
        os.makedirs(dist_dir, exist_ok=True)
        with open(os.path.join(dist_dir, STAMP), "w", encoding="utf-8") as f:
            f.write(sources + "\n")
        built = True
    found = wheels(dist_dir)
    if not found:
        raise ValueError(f"no {PATTERN} in {dist_dir} after building the doctor from {src}")
    wheel = found[-1]
    return {
        "wheel": wheel,
        "sha1": _sha1_file(wheel),
        "version": os.path.basename(wheel).split("-")[1],
        "built": built,
        "sources_sha1": sources,
    }
