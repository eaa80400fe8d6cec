"""Writing the controller's report files in process (no module run, no round trip): a file is written,
atomically, only when its content or mode differs from what is there, and the caller learns which."""

from __future__ import annotations

import os
import stat
import tempfile


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


def write_if_changed(path: str, content: str, mode: int = 0o644, check: bool = False) -> bool:
    """Put `content` at `path` with `mode`; True when the file changed (in check mode: would change).
    The parent folders are made (0755). A reader never sees half a file: the text goes to a temporary
    file beside it, renamed over it."""
    current_mode, current_text = _current(path)
    if (current_mode, current_text) == (mode, content):
        return False
    if check:
        return True
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, mode=0o755, exist_ok=True)
    if current_text == content:  # only the mode differs
        os.chmod(path, mode)
        return True
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(content)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return True
