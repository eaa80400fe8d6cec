"""Writing what a role's state read (ct_state) found different: its files, folders and symlinks, in one
pass inside the container. An item has the shape ct_state reads (type file, directory or link; path,
mode, owner, group; a link's src), and a file's content comes beside it, by the same key: text, or bytes
for a binary file (a wheel). A file is replaced atomically (report_files' replace_atomically), so a reader
never sees half of it; an item already as wanted is left alone.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from collections.abc import Callable
from typing import Any

from ansible_collections.mlstack.pve.plugins.module_utils.report_files import FOLDER_MODE, replace_atomically


def _mode(item: dict[str, Any], default: int) -> int:
    return int(str(item["mode"]), 8) if item.get("mode") else default


def _ids(item: dict[str, Any]) -> tuple[int, int]:
    """(uid, gid) wanted: root where the item says root, else unchanged (-1)."""
    return (0 if item.get("owner") == "root" else -1, 0 if item.get("group") == "root" else -1)


def _settle(path: str, st: os.stat_result, mode: int, ids: tuple[int, int], check: bool) -> bool:
    """Whether `path`'s mode or owner differs from the wanted ones; unless `check`, they are set."""
    uid, gid = ids
    wrong_mode = stat.S_IMODE(st.st_mode) != mode
    wrong_owner = (uid != -1 and st.st_uid != uid) or (gid != -1 and st.st_gid != gid)
    if not check and wrong_mode:
        os.chmod(path, mode)
    if not check and wrong_owner:
        os.chown(path, uid, gid)
    return wrong_mode or wrong_owner


def ensure_directory(item: dict[str, Any], check: bool) -> bool:
    path, mode, ids = item["path"], _mode(item, FOLDER_MODE), _ids(item)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if check:
            return True
        os.makedirs(os.path.dirname(path) or "/", mode=FOLDER_MODE, exist_ok=True)
        os.mkdir(path, mode)
        _settle(path, os.lstat(path), mode, ids, check=False)  # mkdir's mode is masked by the umask
        return True
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{path} exists and is not a directory")
    return _settle(path, st, mode, ids, check)


def _shown(data: bytes | None, binary: bool) -> str:
    """A file's content as a diff shows it: its text, or for a binary file its size and checksum."""
    if data is None:
        return ""
    if binary:
        return f"({len(data)} bytes, binary, sha1 {hashlib.sha1(data).hexdigest()})\n"
    return data.decode("utf-8", errors="replace")


# Checks a file before it replaces the item's path: (command with %s for the file, the file's path);
# raises ValueError saying why the file is refused.
Validate = Callable[[str, str], None]


def ensure_file(
    item: dict[str, Any], content: str | bytes, check: bool, validate: Validate | None = None
) -> tuple[bool, dict[str, str] | None]:
    """(changed, diff) for one file item; the diff is Ansible's before/after of its text (of a binary
    file, its size and sha1). An item with a `validate` command is checked (the new file in its place,
    %s) before it replaces what is there."""
    path, mode, ids = item["path"], _mode(item, 0o644), _ids(item)
    binary = isinstance(content, bytes)
    data = content if isinstance(content, bytes) else content.encode("utf-8")
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise ValueError(f"{path} exists and is not a regular file")
    before: bytes | None = None
    if st is not None:
        with open(path, "rb") as f:
            before = f.read()
    if st is not None and before == data:
        return _settle(path, st, mode, ids, check), None
    diff = {
        "before_header": path,
        "after_header": path,
        "before": _shown(before, binary),
        "after": _shown(data, binary),
    }
    if check:
        return True, diff

    def prepare(tmp: str) -> None:
        _settle(tmp, os.lstat(tmp), mode, ids, check=False)
        if item.get("validate"):
            if validate is None:
                raise ValueError(f"{path}: no way to run its validate command")
            try:
                validate(str(item["validate"]), tmp)
            except ValueError as e:
                raise ValueError(f"{path} not replaced: {e}") from None

    replace_atomically(path, data, prepare)
    return True, diff


def ensure_link(item: dict[str, Any], check: bool) -> tuple[bool, dict[str, str] | None]:
    """(changed, diff) for one symlink item: `path` pointing at `src` as written. A new link is made beside
    it and renamed over it, so a reader of the path finds the old target or the new one, never nothing."""
    path, src = item["path"], str(item.get("src") or "")
    if not src:
        raise ValueError(f"{path}: a link item needs its src")
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{path} exists and is a directory, not a symlink")
    before = os.readlink(path) if st is not None and stat.S_ISLNK(st.st_mode) else None
    if before == src:
        return False, None
    was = "" if st is None else (f"-> {before}\n" if before is not None else "(a regular file)\n")
    diff = {"before_header": path, "after_header": path, "before": was, "after": f"-> {src}\n"}
    if check:
        return True, diff
    folder, name = os.path.split(path)
    tmp = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
    os.symlink(src, tmp)
    try:
        os.replace(tmp, path)
    except OSError:
        os.unlink(tmp)
        raise
    return True, diff


def apply_items(
    items: dict[str, dict[str, Any]],
    contents: dict[str, str | bytes],
    check: bool = False,
    validate: Validate | None = None,
) -> tuple[list[str], list[dict[str, str]]]:
    """Bring every item to its wanted state, folders first, then files and links in the order given: (the
    keys that changed, the diffs)."""
    changed: list[str] = []
    diffs: list[dict[str, str]] = []
    ordered = sorted(items.items(), key=lambda kv: kv[1].get("type") != "directory")
    for key, item in ordered:
        kind = item.get("type")
        if kind == "directory":
            if ensure_directory(item, check):
                changed.append(key)
            continue
        if kind == "file":
            if key not in contents:
                raise ValueError(f"{key}: a file item needs its content")
            did, diff = ensure_file(item, contents[key], check, validate)
        elif kind == "link":
            did, diff = ensure_link(item, check)
        else:
            raise ValueError(f"{key}: type {kind!r} is not a file, a directory or a link")
        if did:
            changed.append(key)
        if diff is not None:
            diffs.append(diff)
    return changed, diffs
