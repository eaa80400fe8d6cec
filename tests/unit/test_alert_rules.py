"""The example alert rules (monitoring/prometheus/) with Prometheus's own promtool: the rules load, and
their unit tests (monitoring/prometheus/mlstack-alerts.test.yml) pass. Skipped when promtool is absent
(Debian: `apt-get install --no-install-recommends prometheus`; .ci/run installs it)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

RULES_DIR = Path(__file__).resolve().parents[2] / "monitoring" / "prometheus"
PROMTOOL = shutil.which("promtool")

pytestmark = pytest.mark.skipif(
    PROMTOOL is None,
    reason="promtool not found on PATH: apt-get install --no-install-recommends prometheus (Debian's "
    "package ships it)",
)


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=120, check=False
    )


def test_the_rules_load() -> None:
    r = promtool("check", "rules", "mlstack-alerts.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 4 rules found" in r.stdout, r.stdout


def test_the_rules_unit_tests_pass() -> None:
    r = promtool("test", "rules", "mlstack-alerts.test.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout, r.stdout
