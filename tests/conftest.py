"""Shared by every suite: this checkout importable as the collection mlstack.pve (plugin unit tests),
and the testbed, brought up once per session (idempotently).

Under MLSTACK_TESTBED_SHARED=1 (tests/lanes.py sets it for the steps that run beside others) the testbed
is only checked, never brought up: `up` rewrites sshd's authorized_keys and puts the GPU model back, under
the feet of the other steps' runs; it must have no GPU model and no driver set; and setting a GPU model
(set_gpu_model) fails at once, naming the step such a test belongs in (tests/lanes.py's node-state step)."""

from __future__ import annotations

import json
import os
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
for path in (REPO / "testbed", *(REPO / "tests" / suite for suite in ("testbed", "provision", "unit"))):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

SHARED = os.environ.get("MLSTACK_TESTBED_SHARED") == "1"
TESTBED_CLI = REPO / "testbed" / "testbed"


def _guard_gpu_model() -> None:
    """set_gpu_model, as every test module imports it, refusing to run in a step beside others."""
    import playbook_runner

    def refused(model: str | None) -> None:
        raise RuntimeError(
            f"set_gpu_model({model!r}) changes the shared testbed for every step running at once: "
            "name this test file in tests/lanes.py's node-state step"
        )

    playbook_runner.set_gpu_model = refused


if SHARED:
    _guard_gpu_model()


@pytest.fixture(scope="session")
def testbed() -> Any:
    """`testbed/testbed up --gpu-nodes 2 --nodes 3` (idempotent) and its connection info."""
    from mlstack_testbed import client

    if SHARED:
        r = subprocess.run(
            [str(TESTBED_CLI), "status", "--json"], capture_output=True, text=True, timeout=120, check=False
        )
        assert r.returncode == 0, (
            f"the testbed is not up (`make testbed` brings it up):\n{r.stdout}\n{r.stderr}"
        )
        status = json.loads(r.stdout)
        changed = {k: status.get(k) for k in ("gpu_model", "driver_version") if status.get(k) is not None}
        assert not changed, f"the shared testbed is not in its plain state: {changed}"
        return client.load()
    r = subprocess.run(
        [str(TESTBED_CLI), "up", "--gpu-nodes", "2", "--nodes", "3"],
        capture_output=True,
        text=True,
        timeout=1200,
        check=False,
    )
    assert r.returncode == 0, f"testbed up failed:\n{r.stdout}\n{r.stderr}"
    return client.load()
