"""`testbed up` restarts the API server when the code it runs is newer than the running process: the
shared modules and the node and lxc subpackages, not gpucheck (which the server never loads)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mlstack_testbed.__main__ import API_CODE, PACKAGE, code_changed_since

MODULES = ("paths.py", "node/backend.py", "node/api.py", "lxc/realct.py", "gpucheck/run.py")


@pytest.fixture
def package(tmp_path: Path) -> Path:
    """A package tree of the testbed's shape, every module dated 1000 s ago; the pidfile 500 s ago."""
    for name in MODULES:
        f = tmp_path / "pkg" / name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text("")
        os.utime(f, (1000, 1000))
    pidfile = tmp_path / "api.pid"
    pidfile.write_text("1\n")
    os.utime(pidfile, (1500, 1500))
    return tmp_path / "pkg"


@pytest.mark.parametrize(
    ("edited", "restart"),
    [
        (None, False),
        ("paths.py", True),
        ("node/backend.py", True),
        ("lxc/realct.py", True),
        ("gpucheck/run.py", False),
    ],
)
def test_restart_when_the_servers_code_is_newer(package: Path, edited: str | None, restart: bool) -> None:
    if edited:
        os.utime(package / edited, (2000, 2000))
    assert code_changed_since(package.parent / "api.pid", package) is restart


def test_the_patterns_cover_the_servers_modules_in_the_real_package() -> None:
    """Every module the server may load (top level, node, lxc) is watched, gpucheck's are not: a layout
    change that moves the server's code elsewhere fails here."""
    watched = {p.relative_to(PACKAGE) for pattern in API_CODE for p in PACKAGE.glob(pattern)}
    everything = {p.relative_to(PACKAGE) for p in PACKAGE.rglob("*.py")}
    served = {p for p in everything if p.parts[0] != "gpucheck"}
    assert Path("node/api.py") in watched and Path("lxc/realct.py") in watched
    assert watched == served
