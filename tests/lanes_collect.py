"""pytest plugin of tests/lanes.py (`-p lanes_collect`): writes the node ids a run collected to the file
MLSTACK_TEST_COLLECTED names, so `make test` can show that every test of the tree ran in some step."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    target = os.environ.get("MLSTACK_TEST_COLLECTED")
    if target:
        Path(target).write_text("".join(f"{item.nodeid}\n" for item in session.items))
