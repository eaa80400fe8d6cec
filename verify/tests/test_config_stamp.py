"""The model config's build stamp: its key follows the files a worker would import, so a venv of the same
hard links (another container's, in the node's uv store) finds the stamp and a changed venv does not; and
through the real doctor with a real transformers, a passed build is stamped and not built again, while a
changed config, environment or failure builds (or fails) for real."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from doctor_testlib import doctor_env, run_doctor
from mlstack_doctor.cache import config_stamp
from mlstack_doctor.probes.model import BUILTIN, CONFIGS

TINY = CONFIGS / BUILTIN["tiny"]


def venv_pair(tmp_path: Path) -> tuple[Path, Path]:
    """Two site-packages folders as uv builds them from one store: the packages' files hard links to the
    same store files, each venv's own metadata (RECORD, INSTALLER, the .pth) written anew, later."""
    store = tmp_path / "store"
    (store / "pkg").mkdir(parents=True)
    (store / "pkg" / "__init__.py").write_text("X = 1\n")
    (store / "pkg" / "big.so").write_bytes(b"\0" * 4096)
    sites = []
    for i, name in enumerate(("a", "b")):
        site = tmp_path / name / "site-packages"
        (site / "pkg").mkdir(parents=True)
        (site / "pkg-1.0.dist-info").mkdir()
        for f in ("__init__.py", "big.so"):
            os.link(store / "pkg" / f, site / "pkg" / f)
        own = {"pkg-1.0.dist-info/RECORD": "pkg/__init__.py,,\n", "_virtualenv.pth": "import x\n"}
        for f, text in own.items():
            (site / f).write_text(text)
            os.utime(site / f, ns=(10**18 + i, 10**18 + i))  # written at another moment
        sites.append(site)
    return sites[0], sites[1]


def test_a_venv_of_the_same_hard_links_has_the_same_key(tmp_path: Path) -> None:
    a, b = venv_pair(tmp_path)
    assert config_stamp.key(TINY, [str(a)]) == config_stamp.key(TINY, [str(b)]) is not None


def test_a_file_changed_anywhere_on_the_import_path_changes_the_key(tmp_path: Path) -> None:
    a, b = venv_pair(tmp_path)
    before = config_stamp.key(TINY, [str(a)])
    # Written in place: every venv linking the file sees it, and builds again.
    with open(a / "pkg" / "__init__.py", "a") as f:
        f.write("Y = 2\n")
    assert config_stamp.key(TINY, [str(a)]) != before
    assert config_stamp.key(TINY, [str(b)]) == config_stamp.key(TINY, [str(a)])
    # Replaced in one venv only (same bytes, a file of its own): that venv's key differs from the other's.
    shutil.copy2(b / "pkg" / "big.so", b / "big.tmp")
    os.replace(b / "big.tmp", b / "pkg" / "big.so")
    assert config_stamp.key(TINY, [str(b)]) != config_stamp.key(TINY, [str(a)])
    # A mode (an unreadable package), a removed or an added file.
    keys = {config_stamp.key(TINY, [str(a)])}
    (a / "pkg").chmod(0o700)
    keys.add(config_stamp.key(TINY, [str(a)]))
    (a / "pkg-1.0.dist-info" / "RECORD").unlink()
    keys.add(config_stamp.key(TINY, [str(a)]))
    (a / "extra.py").write_text("")
    keys.add(config_stamp.key(TINY, [str(a)]))
    assert len(keys) == 4


def test_another_config_or_environment_changes_the_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = venv_pair(tmp_path)
    other = tmp_path / "config.json"
    other.write_text(TINY.read_text().replace('"vocab_size"', '"vocab_size_unused": 1, "vocab_size"', 1))
    keys = {config_stamp.key(TINY, [str(a)]), config_stamp.key(other, [str(a)])}
    monkeypatch.setenv("LD_PRELOAD", "/nonexistent.so")
    keys.add(config_stamp.key(TINY, [str(a)]))
    assert len(keys) == 3


def test_an_import_path_too_large_to_key_is_not_keyed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, _ = venv_pair(tmp_path)
    monkeypatch.setattr(config_stamp, "ENTRIES_MAX", 3)
    assert config_stamp.key(TINY, [str(a)]) is None


def test_a_venv_whose_torch_no_import_compiled_is_named(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    for package in ("torch", "transformers"):
        (site / package / "__pycache__").mkdir(parents=True)
        (site / package / "__init__.py").write_text("")
    assert config_stamp.uncompiled([str(site)]) == ["torch", "transformers"]
    tag = sys.implementation.cache_tag
    (site / "torch" / "__pycache__" / f"__init__.{tag}.pyc").write_bytes(b"")
    assert config_stamp.uncompiled([str(site)]) == ["transformers"]


def test_a_passed_build_is_stamped_and_the_next_run_does_not_build_it(
    torch_venv: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "triton"
    env = doctor_env({"TRITON_CACHE_DIR": str(cache)})
    args = ("--no-gpu", "--only", "model_config", "--model", "tiny")
    first = run_doctor(*args, python=str(torch_venv), env=env)
    built = first.probe("model_config")
    assert first.rc == 0 and built["status"] == "pass", built
    assert "not built again" not in built["summary"] and "built_at" not in built["evidence"]
    stamp = Path(built["evidence"]["config_stamp"])
    assert stamp.parent == cache / config_stamp.STAMP_DIR
    assert json.loads(stamp.read_text())["data"]["params"] == built["evidence"]["params"]

    again = run_doctor(*args, python=str(torch_venv), env=env)
    reused = again.probe("model_config")
    assert again.rc == 0 and reused["status"] == "pass", reused
    assert "with these very files: not built again" in reused["summary"], reused["summary"]
    assert reused["evidence"]["config_stamp"] == str(stamp)
    assert reused["evidence"]["params"] == built["evidence"]["params"]
    assert reused["evidence"]["built_at"] == json.loads(stamp.read_text())["built"]

    # What steers the imports changed: built for real, and stamped under another key.
    moved = run_doctor(*args, python=str(torch_venv), env={**env, "TMPDIR": str(tmp_path)})
    rebuilt = moved.probe("model_config")
    assert rebuilt["status"] == "pass" and "built_at" not in rebuilt["evidence"], rebuilt
    assert len(list((cache / config_stamp.STAMP_DIR).glob("*.json"))) == 2


def test_a_failed_build_is_not_stamped(torch_venv: Path, tmp_path: Path) -> None:
    cache = tmp_path / "triton"
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(
        '{"model_type": "qwen9_next_hybrid", "hidden_size": 8, '
        '"num_hidden_layers": 1, "vocab_size": 8, "num_attention_heads": 1}'
    )
    env = doctor_env({"TRITON_CACHE_DIR": str(cache)})
    args = ("--no-gpu", "--only", "model_config", "--model", str(tmp_path / "model"))
    run = run_doctor(*args, python=str(torch_venv), env=env)
    assert run.rc == 1 and run.probe("model_config")["code"] == "MODEL_TYPE_UNKNOWN"
    assert "config_stamp" not in run.probe("model_config")["evidence"]
    assert not list((cache / config_stamp.STAMP_DIR).glob("*"))
