"""Triton's and inductor's kernel caches, checked instead of trusted.

A cache entry that cannot be loaded is worse than none: Triton takes a cached kernel as compiled, so an
empty or truncated .cubin surfaces as "CUDA driver error: device kernel image is invalid" deep inside a
model's forward, and a group file whose binary is gone as KeyError "Unknown key: 'cubin'". `scan` reads
every entry from disk alone (no torch, no GPU): binaries must be complete ELF files, metadata must
parse, a group file's children must exist. `quarantine` moves bad entries aside INSIDE the cache
(`<cache>/mlstack-quarantine/<time>/`, a folder Triton never looks in), so nothing outside the cache is
touched and nothing is deleted.
"""

from __future__ import annotations

import getpass
import json
import os
import re
import tempfile
import time
from pathlib import Path

BINARY_SUFFIXES = (".cubin", ".so", ".hsaco")
QUARANTINE = "mlstack-quarantine"
MAX_FILES = 20000  # a cache this large is still read in about a second


def inductor_cache_path() -> tuple[str, str]:
    """(folder, where it came from) as torch._inductor picks it: TORCHINDUCTOR_CACHE_DIR, else
    <tmp>/torchinductor_<user>."""
    if os.environ.get("TORCHINDUCTOR_CACHE_DIR"):
        return os.environ["TORCHINDUCTOR_CACHE_DIR"], "TORCHINDUCTOR_CACHE_DIR"
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    user = re.sub(r'[\\/:*?"<>|]', "_", user)
    return os.path.join(
        tempfile.gettempdir(), f"torchinductor_{user}"
    ), "default (tempdir/torchinductor_<user>)"


def elf_problem(path: Path) -> str | None:
    """Why `path` is not a complete ELF file (None when it is): empty, not ELF, or cut short (its
    program or section headers, or a section's bytes, lie beyond the end of the file)."""
    try:
        size = path.stat().st_size
        with path.open("rb") as f:
            head = f.read(64)
            if size == 0:
                return "empty (0 bytes)"
            if head[:4] != b"\x7fELF":
                return f"not an ELF binary ({size} bytes, starts {head[:4]!r})"
            if head[4] != 2 or len(head) < 64:
                return f"not a 64-bit ELF file ({size} bytes)"
            order = "little" if head[5] == 1 else "big"

            def num(off: int, n: int) -> int:
                return int.from_bytes(head[off : off + n], order)

            phoff, shoff = num(0x20, 8), num(0x28, 8)
            phentsize, phnum, shentsize, shnum = num(0x36, 2), num(0x38, 2), num(0x3A, 2), num(0x3C, 2)
            if phoff + phnum * phentsize > size:
                return f"truncated: program headers end at byte {phoff + phnum * phentsize}, file has {size}"
            if shoff + shnum * shentsize > size:
                return f"truncated: section headers end at byte {shoff + shnum * shentsize}, file has {size}"
            f.seek(shoff)
            table = f.read(shnum * shentsize)
    except OSError as exc:
        return f"unreadable: {exc}"
    for i in range(shnum):
        entry = table[i * shentsize : (i + 1) * shentsize]
        sh_type = int.from_bytes(entry[4:8], order)
        off, length = int.from_bytes(entry[0x18:0x20], order), int.from_bytes(entry[0x20:0x28], order)
        if sh_type != 8 and off + length > size:  # 8: SHT_NOBITS (.bss) has no bytes in the file
            return f"truncated: section {i} ends at byte {off + length}, file has {size}"
    return None


def file_problem(path: Path) -> str | None:
    """Why a cache file cannot be loaded, by its kind; None when it can (or its kind is not checked)."""
    name = path.name
    if name.endswith(BINARY_SUFFIXES):
        return elf_problem(path)
    if name.endswith(".json"):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            return f"metadata does not parse: {type(exc).__name__}: {exc}"
        if name.startswith("__grp__") and isinstance(data, dict):
            children = data.get("child_paths")
            if not isinstance(children, dict):
                return "group file without child_paths"
            gone = sorted(k for k, p in children.items() if not os.path.exists(str(p)))
            if gone:
                return f"metadata without its files: {', '.join(gone)} listed but missing"
        return None
    if name.endswith(".py"):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            return f"unreadable: {exc}"
        if not text.strip():
            return "empty generated module"
        try:
            compile(text, str(path), "exec")
        except (SyntaxError, ValueError) as exc:
            return f"generated module cut short or damaged: {type(exc).__name__}: {exc}"
        return None
    return None


def scan(root: str) -> dict[str, object]:
    """{'entries': N, 'files': N, 'bad': {folder: [problems]}, 'binaries': [paths of .cubin]} for `root`."""
    base = Path(root)
    bad: dict[str, list[str]] = {}
    cubins: list[str] = []
    files = 0
    truncated = False
    if not base.is_dir():
        return {"entries": 0, "files": 0, "bad": {}, "cubins": [], "exists": False}
    entries = [e for e in base.iterdir() if not e.name.startswith("mlstack-")]
    for dirpath, dirnames, filenames in os.walk(base):
        if Path(dirpath) == base:
            dirnames[:] = [d for d in dirnames if not d.startswith("mlstack-")]
        for fname in filenames:
            files += 1
            if files > MAX_FILES:
                truncated = True
                break
            path = Path(dirpath, fname)
            why = file_problem(path)
            if why:
                unit = path.parent if path.parent != base else path
                bad.setdefault(str(unit), []).append(f"{fname}: {why}")
            elif fname.endswith(".cubin"):
                cubins.append(str(path))
        if truncated:
            break
    out: dict[str, object] = {
        "exists": True,
        "entries": len(entries),
        "files": files,
        "bad": bad,
        "cubins": cubins,
    }
    if truncated:
        out["checked_only_first"] = MAX_FILES
    return out


def quarantine(root: str, folders: list[str]) -> dict[str, str]:
    """Move each bad folder (or file) of the cache at `root` into <root>/mlstack-quarantine/<time>/;
    {source: destination}. Anything that does not lie strictly inside `root` is left alone."""
    base = os.path.realpath(root)
    dest_root = os.path.join(base, QUARANTINE, time.strftime("%Y%m%dT%H%M%SZ", time.gmtime()))
    moved: dict[str, str] = {}
    for folder in folders:
        real = os.path.realpath(folder)
        if real == base or not real.startswith(base + os.sep) or f"{os.sep}{QUARANTINE}{os.sep}" in real:
            continue
        rel = os.path.relpath(real, base)
        dest = os.path.join(dest_root, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.rename(real, dest)
        moved[folder] = dest
    return moved
