"""Shared by every suite: this checkout importable as the collection mlstack.pve (plugin unit tests),
and the testbed, brought up once per session (idempotently)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
COLLECTIONS = REPO / ".venv" / "collections"
if COLLECTIONS.is_dir() and str(COLLECTIONS) not in sys.path:
    sys.path.insert(0, str(COLLECTIONS))
# Helper modules of the suites (never imported as `conftest`: that name is ambiguous across suites).
for path in (REPO / "testbed", REPO / "tests" / "testbed", REPO / "tests" / "provision"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))


@pytest.fixture(scope="session")
def testbed() -> Any:
    """`testbed/testbed up --gpu-nodes 2` (idempotent) and its connection info."""
    from mlstack_testbed import client

    r = subprocess.run(
        [str(REPO / "testbed" / "testbed"), "up", "--gpu-nodes", "2"],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert r.returncode == 0, f"testbed up failed:\n{r.stdout}\n{r.stderr}"
    return client.load()
