"""Shared fixtures: run the doctor for real as a subprocess, and build real broken environments."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from doctor_testlib import (
    PY_VER,
    TEST_TORCH,
    TEST_TRANSFORMERS,
    write_lock,
)

# The torch venv is installed without bytecode; each doctor the tests start imports torch and
# transformers. With PYTHONDONTWRITEBYTECODE set (some CI shells set it) no import would write its .pyc,
# and every one of those processes would compile torch again from source (seconds of CPU each).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)


@pytest.fixture(scope="session")
def torch_venv() -> Path:
    """A real venv with torch (CPU) and transformers, built once and kept under /tmp between sessions."""
    root = Path(f"/tmp/mlstack-doctor-testenv-py{PY_VER}-torch{TEST_TORCH}")
    py = root / "bin" / "python"
    marker = root / ".complete"
    if not marker.exists():
        shutil.rmtree(root, ignore_errors=True)
        steps = [
            [sys.executable, "-m", "venv", str(root)],
            [
                str(py),
                "-m",
                "pip",
                "install",
                "-q",
                # No bytecode compiled up front (half the install's CPU): the tests' imports compile what
                # they use, once, into the venv (with bytecode writing on: see above).
                "--no-compile",
                f"torch=={TEST_TORCH}",
                f"transformers=={TEST_TRANSFORMERS}",
            ],
        ]
        for argv in steps:
            proc = subprocess.run(argv, capture_output=True, text=True, timeout=900)
            # A failure, not a skip: the end-to-end doctor tests need it, and `make test` needs the network
            # throughout (the testbed's template, apt and uv in its containers), so no run that could pass
            # lacks it; a skip would leave those tests out with the step green.
            if proc.returncode != 0:
                pytest.fail(
                    f"cannot build the torch test venv ({' '.join(argv[:4])}...): {proc.stderr[-500:]}",
                    pytrace=False,
                )
        marker.write_text("ok")
    return py


@pytest.fixture
def matching_lock(tmp_path: Path) -> Path:
    """A profile lock that matches the test venv (torch CPU + transformers)."""
    return write_lock(
        tmp_path / "profile", {"torch": TEST_TORCH + "+cpu", "transformers": TEST_TRANSFORMERS}
    ).parent


@pytest.fixture(scope="session")
def headerless_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv whose BASE interpreter has no Python.h: a copy of this interpreter, relocated, no include/.

    CPython finds its prefix from the executable's location (the lib/pythonX.Y/os.py landmark), so a copy of
    the binary beside a link to the real stdlib is a working interpreter whose sysconfig include dir
    (<prefix>/include/pythonX.Y) does not exist, exactly like a Debian python3 without python3-dev.
    """
    base = tmp_path_factory.mktemp("headerless")
    prefix, stdlib = base / "prefix", Path(sysconfig.get_paths()["stdlib"])
    (prefix / "bin").mkdir(parents=True)
    (prefix / "lib").mkdir()
    exe = prefix / "bin" / f"python{PY_VER}"
    shutil.copy2(os.path.realpath(sys.executable), exe)
    (prefix / "lib" / f"python{PY_VER}").symlink_to(stdlib)
    probe = subprocess.run(
        [str(exe), "-c", "import sysconfig; print(sysconfig.get_paths()['include'])"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0 or not probe.stdout.strip().startswith(str(prefix)):
        pytest.skip(f"this interpreter cannot be relocated: {probe.stdout} {probe.stderr[-300:]}")
    venv = base / "venv"
    made = subprocess.run(
        [str(exe), "-m", "venv", "--without-pip", str(venv)], capture_output=True, text=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot make a venv from the relocated interpreter: {made.stderr[-300:]}")
    return venv / "bin" / "python"
