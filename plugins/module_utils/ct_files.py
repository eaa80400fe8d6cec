"""Writing what a role's state read (ct_state) found different: its files and folders, in one pass inside
the container. An item has the shape ct_state reads (type file or directory, path, mode, owner, group),
and a file's content comes beside it, by the same key. A file is replaced atomically (a temporary file
beside it, renamed over it), so a reader never sees half of it; an item already as wanted is left alone.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable
from typing import Any

# Folders made on the way to an item, as a role's own folders are.
PARENT_MODE = 0o755


def _mode(item: dict[str, Any], default: int) -> int:
    return int(str(item["mode"]), 8) if item.get("mode") else default


def _ids(item: dict[str, Any]) -> tuple[int, int]:
    """(uid, gid) wanted: root where the item says root, else unchanged (-1)."""
    return (0 if item.get("owner") == "root" else -1, 0 if item.get("group") == "root" else -1)


def _settle(path: str, st: os.stat_result, mode: int, ids: tuple[int, int]) -> bool:
    """Give `path` its mode and owner; True when either changed."""
    changed = False
    if stat.S_IMODE(st.st_mode) != mode:
        os.chmod(path, mode)
        changed = True
    if _wrong_owner(st, ids):
        os.chown(path, *ids)
        changed = True
    return changed


def _differs(st: os.stat_result, mode: int, ids: tuple[int, int]) -> bool:
    return stat.S_IMODE(st.st_mode) != mode or _wrong_owner(st, ids)


def _wrong_owner(st: os.stat_result, ids: tuple[int, int]) -> bool:
    uid, gid = ids
    return (uid != -1 and st.st_uid != uid) or (gid != -1 and st.st_gid != gid)


def ensure_directory(item: dict[str, Any], check: bool) -> bool:
    path, mode, ids = item["path"], _mode(item, PARENT_MODE), _ids(item)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        if check:
            return True
        os.makedirs(os.path.dirname(path) or "/", mode=PARENT_MODE, exist_ok=True)
        os.mkdir(path, mode)
        _settle(path, os.lstat(path), mode, ids)  # mkdir's mode is masked by the umask
        return True
    if not stat.S_ISDIR(st.st_mode):
        raise ValueError(f"{path} exists and is not a directory")
    return _differs(st, mode, ids) if check else _settle(path, st, mode, ids)


def _text(data: bytes | None) -> str:
    return "" if data is None else data.decode("utf-8", errors="replace")


# Checks a file before it replaces the item's path: (command with %s for the file, the file's path);
# raises ValueError saying why the file is refused.
Validate = Callable[[str, str], None]


def ensure_file(
    item: dict[str, Any], content: str, check: bool, validate: Validate | None = None
) -> tuple[bool, dict[str, str] | None]:
    """(changed, diff) for one file item; the diff is Ansible's before/after of its text. An item with a
    `validate` command is checked (the new file in its place, %s) before it replaces what is there."""
    path, mode, ids = item["path"], _mode(item, 0o644), _ids(item)
    data = content.encode("utf-8")
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
        return (_differs(st, mode, ids) if check else _settle(path, st, mode, ids)), None
    diff = {"before_header": path, "after_header": path, "before": _text(before), "after": content}
    if check:
        return True, diff
    folder = os.path.dirname(path) or "/"
    os.makedirs(folder, mode=PARENT_MODE, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        _settle(tmp, os.lstat(tmp), mode, ids)
        if item.get("validate"):
            if validate is None:
                raise ValueError(f"{path}: no way to run its validate command")
            try:
                validate(str(item["validate"]), tmp)
            except ValueError as e:
                raise ValueError(f"{path} not replaced: {e}") from None
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True, diff


def apply_items(
    items: dict[str, dict[str, Any]],
    contents: dict[str, str],
    check: bool = False,
    validate: Validate | None = None,
) -> tuple[list[str], list[dict[str, str]]]:
    """Bring every item to its wanted state, folders first: (the keys that changed, the files' diffs)."""
    changed: list[str] = []
    diffs: list[dict[str, str]] = []
    ordered = sorted(items.items(), key=lambda kv: kv[1].get("type") != "directory")
    for key, item in ordered:
        if item.get("type") == "directory":
            if ensure_directory(item, check):
                changed.append(key)
        elif item.get("type") == "file":
            if key not in contents:
                raise ValueError(f"{key}: a file item needs its content")
            did, diff = ensure_file(item, contents[key], check, validate)
            if did:
                changed.append(key)
            if diff is not None:
                diffs.append(diff)
        else:
            raise ValueError(f"{key}: type {item.get('type')!r} is not a file or a directory")
    return changed, diffs
