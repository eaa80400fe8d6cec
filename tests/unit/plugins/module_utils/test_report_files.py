"""The controller's report writer on real files: written only when content or mode differs, never half a
file, nothing written in check mode."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from ansible_collections.mlstack.pve.plugins.module_utils.report_files import (
    differs,
    read_text,
    write_if_changed,
)


def test_a_new_file_is_written_with_its_folders_and_mode(tmp_path: Path) -> None:
    path = tmp_path / "reports" / "doctor" / "ct.json"
    assert write_if_changed(str(path), "{}\n") is True
    assert path.read_text() == "{}\n"
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert os.listdir(path.parent) == ["ct.json"]  # no temporary file left beside it


def test_the_same_content_is_not_written_again(tmp_path: Path) -> None:
    path = tmp_path / "fleet.md"
    write_if_changed(str(path), "# Fleet report\n")
    before = path.stat()
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns - 10**9))
    assert write_if_changed(str(path), "# Fleet report\n") is False
    after = path.stat()
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns - 10**9)


def test_new_content_replaces_the_file(tmp_path: Path) -> None:
    path = tmp_path / "fleet.json"
    write_if_changed(str(path), "old\n")
    assert write_if_changed(str(path), "new\n") is True
    assert path.read_text() == "new\n"


def test_a_wrong_mode_alone_is_a_change(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text("x")
    path.chmod(0o600)
    assert differs(str(path), "x", 0o644)
    assert write_if_changed(str(path), "x", 0o644) is True
    assert stat.S_IMODE(path.stat().st_mode) == 0o644 and path.read_text() == "x"


def test_check_mode_says_it_would_change_and_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "new" / "r.json"
    assert write_if_changed(str(path), "x", check=True) is True
    assert not path.parent.exists()


def test_a_folder_in_the_way_is_no_text(tmp_path: Path) -> None:
    assert read_text(str(tmp_path)) is None and read_text(str(tmp_path / "missing")) is None
