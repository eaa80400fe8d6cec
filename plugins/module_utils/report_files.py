"""Writing the controller's report files in process (no module run, no round trip): a file is written,
atomically, only when its content or mode differs from what is there, and the caller learns which. The
atomic replacement is also ct_files' (a role's files inside a container)."""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable

# Folders made on the way to a file.
FOLDER_MODE = 0o755


def read_text(path: str) -> str | None:
    """The file's text, or None where there is none (missing, a folder, unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return None


def _current(path: str) -> tuple[int | None, str | None]:
    """(mode, text) of what is at `path` now; None for what cannot be had."""
    try:
        st = os.stat(path)
    except OSError:
        return None, None
    return stat.S_IMODE(st.st_mode), read_text(path)


def differs(path: str, content: str, mode: int = 0o644) -> bool:
    """Whether writing `content` with `mode` to `path` would change it."""
    return _current(path) != (mode, content)


def replace_atomically(path: str, data: bytes, prepare: Callable[[str], None]) -> None:
    """Put `data` at `path` through a temporary file beside it (the parent folders made 0755), synced and
    given what `prepare(temporary path)` does (its mode, owner, a check that may raise) before it is
    renamed over `path`: a reader never sees half a file, and a failure leaves what was there."""
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, mode=FOLDER_MODE, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        prepare(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_if_changed(path: str, content: str, mode: int = 0o644, check: bool = False) -> bool:
    """Put `content` at `path` with `mode`; True when the file changed (in check mode: would change).
    The parent folders are made (0755). A reader never sees half a file (replace_atomically)."""
    current_mode, current_text = _current(path)
    if (current_mode, current_text) == (mode, content):
        return False
    if check:
        return True
    if current_text == content:  # only the mode differs
        os.chmod(path, mode)
        return True
    replace_atomically(path, content.encode("utf-8"), lambda tmp: os.chmod(tmp, mode))
    return True
