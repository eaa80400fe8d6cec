"""mlstack.pve.doctor_wheel: the doctor's wheel is built on the controller only when its sources changed
(the checksum kept beside it is the shell's `sha1sum` of them, so a wheel built before stays valid), and
the action, as a play runs it, returns the wheel with its checksum and version and names a missing uv."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest
from ansible_collections.mlstack.pve.plugins.module_utils import doctor_wheel, stack_policy
from ansible_collections.mlstack.pve.plugins.module_utils.stack_packages import STACK
from localplay import run_module

ROOT = Path(__file__).resolve().parents[4]
PIPELINE = (
    'find pyproject.toml src "(" -name __pycache__ -o -name "*.egg-info" ")" -prune -o -type f'
    " -print0 | LC_ALL=C sort -z | xargs -0 sha1sum | sha1sum"
)


def sources(tmp_path: Path) -> Path:
    src = tmp_path / "verify"
    (src / "src" / "pkg" / "__pycache__").mkdir(parents=True)
    (src / "src" / "pkg.egg-info").mkdir()
    (src / "pyproject.toml").write_text("[project]\nname = 'pkg'\n")
    (src / "README.md").write_text("pkg\n")
    (src / "src" / "pkg" / "__init__.py").write_text("X = 1\n")
    (src / "src" / "pkg" / "B.py").write_text("Y = 2\n")
    (src / "src" / "pkg" / "__pycache__" / "x.pyc").write_bytes(b"cache")
    (src / "src" / "pkg.egg-info" / "PKG-INFO").write_text("left out\n")
    return src


@pytest.mark.parametrize("where", ["a made-up tree", "the doctor's own sources"])
def test_the_checksum_is_the_shells(tmp_path: Path, where: str) -> None:
    src = sources(tmp_path) if where == "a made-up tree" else ROOT / "verify"
    shell = subprocess.run(PIPELINE, shell=True, cwd=src, capture_output=True, text=True, check=True)
    assert doctor_wheel.source_sha1(str(src)) == shell.stdout.split()[0]


class Builder:
    """uv build's stand-in: records each call and writes a wheel into --out-dir."""

    def __init__(self, rc: int = 0) -> None:
        self.calls: list[list[str]] = []
        self.rc = rc

    def __call__(self, argv: list[str], env: dict[str, str]) -> tuple[int, str, str]:
        self.calls.append(argv)
        assert env["SOURCE_DATE_EPOCH"] == "315532800"
        if self.rc:
            return self.rc, "", "error: no build backend"
        out = Path(argv[argv.index("--out-dir") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "mlstack_doctor-0.2.0-py3-none-any.whl").write_bytes(b"wheel")
        return 0, "", ""


def test_a_wheel_is_built_once_and_again_only_when_the_sources_change(tmp_path: Path) -> None:
    src, dist, build = sources(tmp_path), tmp_path / "dist", Builder()
    first = doctor_wheel.ensure_wheel("/uv", str(src), str(dist), build)
    assert (
        first["built"] and first["version"] == "0.2.0" and first["sha1"] == hashlib.sha1(b"wheel").hexdigest()
    )
    again = doctor_wheel.ensure_wheel("/uv", str(src), str(dist), build)
    assert not again["built"] and again["wheel"] == first["wheel"] and len(build.calls) == 1
    (src / "README.md").write_text("pkg, documented further\n")
    docs = doctor_wheel.ensure_wheel("/uv", str(src), str(dist), build)
    assert not docs["built"] and docs["sha1"] == first["sha1"] and len(build.calls) == 1
    (src / "src" / "pkg" / "B.py").write_text("Y = 3\n")
    changed = doctor_wheel.ensure_wheel("/uv", str(src), str(dist), build)
    assert changed["built"] and len(build.calls) == 2
    assert (dist / doctor_wheel.STAMP).read_text().strip() == changed["sources_sha1"]


def test_a_failed_build_says_what_uv_said(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="exited 2: error: no build backend"):
        doctor_wheel.ensure_wheel("/uv", str(sources(tmp_path)), str(tmp_path / "dist"), Builder(rc=2))


def built_before(tmp_path: Path, src: Path, dist: Path) -> Path:
    """profiles/ beside the sources, their shipped_profiles.json written, and a wheel already built from
    exactly these sources (its stamp matches them). Returns the shipped_profiles.json."""
    shutil.copytree(ROOT / "profiles", tmp_path / "profiles")
    shipped = src / "src" / "mlstack_doctor" / "shipped_profiles.json"
    shipped.parent.mkdir()
    stack_policy.write_shipped(str(tmp_path / "profiles"), str(shipped), STACK)
    dist.mkdir()
    (dist / "mlstack_doctor-0.3.1-py3-none-any.whl").write_bytes(b"built before")
    (dist / doctor_wheel.STAMP).write_text(doctor_wheel.source_sha1(str(src)) + "\n")
    return shipped


def test_the_action_returns_the_wheel_and_names_a_missing_uv(tmp_path: Path) -> None:
    src, dist = sources(tmp_path), tmp_path / "dist"
    built_before(tmp_path, src, dist)
    # The sources match the stamp: nothing is built, so uv is never run (/bin/false would fail).
    found = run_module(
        "mlstack.pve.doctor_wheel", {"uv": "/bin/false", "src": str(src), "dist_dir": str(dist)}
    )
    assert not found.get("failed") and not found["changed"], found
    assert (found["version"], found["built"]) == ("0.3.1", False)
    missing = run_module(
        "mlstack.pve.doctor_wheel", {"uv": str(tmp_path / "no-uv"), "src": str(src), "dist_dir": str(dist)}
    )
    assert missing["failed"] and f"{tmp_path}/no-uv does not exist" in missing["msg"], missing


def test_the_action_writes_the_shipped_profiles_first_so_a_changed_rule_builds_again(tmp_path: Path) -> None:
    """The doctor's shipped_profiles.json is written from profiles/ beside its sources before the build: a
    changed rule changes the sources, and the wheel is built again (here by /bin/false: it fails)."""
    src, dist = sources(tmp_path), tmp_path / "dist"
    args = {"uv": "/bin/false", "src": str(src), "dist_dir": str(dist)}
    missing = run_module("mlstack.pve.doctor_wheel", args)
    assert missing["failed"] and "there is no such folder" in missing["msg"], missing
    shipped = built_before(tmp_path, src, dist)
    assert not run_module("mlstack.pve.doctor_wheel", args).get("failed")
    policy = tmp_path / "profiles" / "policy.yml"
    policy.write_text(policy.read_text().replace("open (outside Triton's supported hardware)", "still open"))
    rebuilt = run_module("mlstack.pve.doctor_wheel", args)
    assert rebuilt["failed"] and "/bin/false" in rebuilt["msg"], rebuilt
    assert "still open" in shipped.read_text()
