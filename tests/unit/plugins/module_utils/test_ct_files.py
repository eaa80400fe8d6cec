"""mlstack.pve.ct_files, the writing half of ct_state, for real (ansible on localhost, real files): the
items of a state read written in one call, each only where it differs (content, mode, owner), folders
first; check mode writes nothing and shows the diff; a path of the wrong kind is refused by name."""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path
from typing import Any

from localplay import run_module, run_play

BUILDER = "#!/bin/sh\necho build\n"
LOCK = "version = 1\n"


def items(root: Path) -> dict[str, dict[str, Any]]:
    # In the order a role lists them: a file before its folder, which the module makes first.
    return {
        "builder": {
            "type": "file",
            "path": f"{root}/bin/build",
            "mode": "0755",
            "owner": "root",
            "group": "root",
        },
        "lock": {"type": "file", "path": f"{root}/profile/uv.lock", "mode": "0644", "sha1": "ignored"},
        "bin_dir": {
            "type": "directory",
            "path": f"{root}/bin",
            "mode": "0750",
            "owner": "root",
            "group": "root",
        },
        "venvs": {"type": "directory", "path": f"{root}/venvs", "mode": "0755"},
    }


def write(root: Path, contents: dict[str, str] | None = None) -> dict[str, Any]:
    return run_module(
        "mlstack.pve.ct_files",
        {"items": items(root), "contents": contents or {"builder": BUILDER, "lock": LOCK}},
    )


# The module as a play runs it (check and diff mode, -vvv), with the test's items, contents and sources.
PLAY = """
- hosts: localhost
  connection: local
  gather_facts: false
  tasks:
    - name: Write what differs
      mlstack.pve.ct_files:
        items: "{{ items }}"
        contents: "{{ contents | default({}) }}"
        sources: "{{ sources | default({}) }}"
"""


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_tree_is_written_then_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "opt"
    first = write(root)
    assert first["changed"] and sorted(first["changed_items"]) == ["bin_dir", "builder", "lock", "venvs"], (
        first
    )
    assert (root / "bin" / "build").read_text() == BUILDER and mode(root / "bin" / "build") == 0o755
    assert (root / "profile" / "uv.lock").read_text() == LOCK and mode(root / "profile" / "uv.lock") == 0o644
    assert mode(root / "bin") == 0o750 and mode(root / "venvs") == 0o755  # the item's mode, not the umask's
    again = write(root)
    assert again["changed"] is False and again["changed_items"] == [], again


def test_only_what_differs_is_written(tmp_path: Path) -> None:
    root = tmp_path / "opt"
    write(root)
    builder, lock = root / "bin" / "build", root / "profile" / "uv.lock"
    lock.write_text("edited by hand\n")
    builder.chmod(0o700)
    inode = builder.stat().st_ino
    os.chown(root / "venvs", 1234, 1234)
    result = write(root)
    assert sorted(result["changed_items"]) == ["builder", "lock"], result  # venvs: no owner asked
    assert lock.read_text() == LOCK
    assert mode(builder) == 0o755 and builder.stat().st_ino == inode  # its mode set, its content untouched
    os.chown(builder, 1234, 1234)
    owner = write(root)
    assert owner["changed_items"] == ["builder"] and builder.stat().st_uid == 0 and builder.stat().st_gid == 0


def test_check_mode_writes_nothing_and_shows_the_diff(tmp_path: Path) -> None:
    root = tmp_path / "opt"
    write(root)
    other = {"builder": "#!/bin/sh\necho other\n", "lock": "version = 1\n"}
    out = run_play(tmp_path, PLAY, {"items": items(root), "contents": other}, "--check", "--diff")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "-echo build" in out.stdout and "+echo other" in out.stdout, out.stdout
    assert "changed: [localhost]" in out.stdout
    assert (root / "bin" / "build").read_text() == BUILDER  # nothing written


def test_a_path_of_the_wrong_kind_is_refused_by_name(tmp_path: Path) -> None:
    root = tmp_path / "opt"
    (root / "profile" / "uv.lock").mkdir(parents=True)
    result = write(root)
    assert (
        result.get("failed") and f"{root}/profile/uv.lock exists and is not a regular file" in result["msg"]
    )
    missing = run_module("mlstack.pve.ct_files", {"items": items(tmp_path / "other"), "contents": {}})
    assert missing.get("failed") and "builder: a file item needs its content" in missing["msg"], missing


def test_a_file_its_check_refuses_is_not_written(tmp_path: Path) -> None:
    settings = {
        "type": "file",
        "path": f"{tmp_path}/etc/doctor.json",
        "mode": "0644",
        "validate": "grep -q venv %s",
    }
    good = run_module(
        "mlstack.pve.ct_files", {"items": {"settings": settings}, "contents": {"settings": '{"venv": 1}\n'}}
    )
    assert good["changed"] and (tmp_path / "etc" / "doctor.json").read_text() == '{"venv": 1}\n', good
    bad = run_module(
        "mlstack.pve.ct_files", {"items": {"settings": settings}, "contents": {"settings": "{}\n"}}
    )
    assert bad.get("failed") and f"{tmp_path}/etc/doctor.json not replaced: grep -q venv" in bad["msg"], bad
    assert (tmp_path / "etc" / "doctor.json").read_text() == '{"venv": 1}\n'  # the old file stays
    assert [p.name for p in (tmp_path / "etc").iterdir()] == ["doctor.json"]  # no temporary file left


def test_a_binary_source_is_copied_with_its_folder_in_one_call(tmp_path: Path) -> None:
    """A wheel from the controller (`sources`), byte for byte; again, nothing changes; -vvv and --diff show
    its size, not its bytes; a source that cannot be read is named."""
    wheel = tmp_path / "build" / "tool-1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    data = bytes(range(256)) * 64 + b"\xff\xfe not text"
    wheel.write_bytes(data)
    root = tmp_path / "opt"
    wanted = {
        "dist": {"type": "directory", "path": f"{root}/dist", "mode": "0755"},
        "wheel": {"type": "file", "path": f"{root}/dist/{wheel.name}", "mode": "0644"},
    }
    first = run_module("mlstack.pve.ct_files", {"items": wanted, "sources": {"wheel": str(wheel)}})
    assert sorted(first["changed_items"]) == ["dist", "wheel"], first
    assert (root / "dist" / wheel.name).read_bytes() == data and mode(root / "dist" / wheel.name) == 0o644
    again = run_module("mlstack.pve.ct_files", {"items": wanted, "sources": {"wheel": str(wheel)}})
    assert again["changed"] is False, again
    wheel.write_bytes(data[::-1])
    # ansible-core 2.21 puts the module's arguments in the result (which -vvv shows) only where asked to;
    # 2.19 always does, and ignores the setting.
    shown = {"ANSIBLE_INJECT_INVOCATION": "true"}
    evars = {"items": wanted, "sources": {"wheel": str(wheel)}}
    out = run_play(tmp_path, PLAY, evars, "--diff", "-vvv", env=shown)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"{len(data)} bytes from {wheel}" in out.stdout, out.stdout  # the arguments as -vvv shows them
    size = f"({len(data)} bytes, binary, sha1"
    before, after = (f"{size} {hashlib.sha1(d).hexdigest()})" for d in (data, data[::-1]))
    assert f"-{before}" in out.stdout and f"+{after}" in out.stdout, out.stdout
    assert (root / "dist" / wheel.name).read_bytes() == data[::-1]
    assert "AAECAwQF" not in out.stdout  # no base64 of the wheel in the output
    gone = run_module(
        "mlstack.pve.ct_files", {"items": wanted, "sources": {"wheel": str(tmp_path / "missing.whl")}}
    )
    assert (
        gone.get("failed") and f"wheel: cannot read {tmp_path}/missing.whl on the controller" in gone["msg"]
    )


def test_a_link_is_pointed_at_its_target_by_a_rename_and_then_left_alone(tmp_path: Path) -> None:
    """The active venv's switch: venv.previous kept, venv pointed at the new target; a reader of venv sees
    the old target or the new one (the link is renamed over it, its inode changes); again, nothing."""
    (tmp_path / "venvs" / "a").mkdir(parents=True)
    (tmp_path / "venvs" / "b").mkdir()
    active = tmp_path / "venv"
    active.symlink_to(tmp_path / "venvs" / "a")
    before = os.lstat(active).st_ino
    links = {
        "previous": {"type": "link", "path": f"{tmp_path}/venv.previous", "src": f"{tmp_path}/venvs/a"},
        "active": {"type": "link", "path": str(active), "src": f"{tmp_path}/venvs/b"},
    }
    switched = run_module("mlstack.pve.ct_files", {"items": links})
    assert switched["changed_items"] == ["previous", "active"], switched
    assert os.readlink(active) == f"{tmp_path}/venvs/b" and os.lstat(active).st_ino != before
    assert os.readlink(tmp_path / "venv.previous") == f"{tmp_path}/venvs/a"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "venv",
        "venv.previous",
        "venvs",
    ]  # no temporary link
    again = run_module("mlstack.pve.ct_files", {"items": links})
    assert again["changed"] is False, again
    (tmp_path / "venvs" / "c").mkdir()
    other = {"active": {**links["active"], "src": f"{tmp_path}/venvs/c"}}
    planned = run_play(tmp_path, PLAY, {"items": other}, "--check", "--diff")
    assert planned.returncode == 0 and "changed: [localhost]" in planned.stdout, planned.stdout
    assert f"-> {tmp_path}/venvs/c" in planned.stdout and os.readlink(active) == f"{tmp_path}/venvs/b"
    folder = {"active": {"type": "link", "path": str(tmp_path / "venvs"), "src": "/x"}}
    refused = run_module("mlstack.pve.ct_files", {"items": folder})
    assert (
        refused.get("failed")
        and f"{tmp_path}/venvs exists and is a directory, not a symlink" in refused["msg"]
    )
