"""pytest plugin of tests/lanes.py (`-p lanes_collect`): writes the node ids a run collected to the file
MLSTACK_TEST_COLLECTED names, so `make test` can show that every test of the tree ran in some step, and
the run's outcomes (counts, and each skip with its reason) to the file MLSTACK_TEST_OUTCOMES names, so
`make test` can count and judge its skips (tests/skips.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

OUTCOMES_ENV = "MLSTACK_TEST_OUTCOMES"
_counts: dict[str, int] = {"passed": 0, "failed": 0, "errors": 0, "xfailed": 0, "xpassed": 0}
_skips: list[dict[str, str]] = []


def pytest_collection_finish(session: pytest.Session) -> None:
    target = os.environ.get("MLSTACK_TEST_COLLECTED")
    if target:
        Path(target).write_text("".join(f"{item.nodeid}\n" for item in session.items))


def skip_reason(report: pytest.TestReport) -> str:
    """The reason a skipped report gives (pytest keeps it as (path, line, "Skipped: reason"))."""
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
    return text.removeprefix("Skipped: ")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if hasattr(report, "wasxfail"):
        if report.when == "call" or report.skipped:
            _counts["xpassed" if report.passed else "xfailed"] += 1
    elif report.skipped:
        _skips.append({"nodeid": report.nodeid, "reason": skip_reason(report)})
    elif report.failed:
        _counts["failed" if report.when == "call" else "errors"] += 1
    elif report.passed and report.when == "call":
        _counts["passed"] += 1


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get(OUTCOMES_ENV)
    if target:
        Path(target).write_text(json.dumps({**_counts, "skipped": _skips}, indent=1) + "\n")
