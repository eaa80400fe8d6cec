from __future__ import annotations

import pytest
from ansible_collections.mlstack.pve.plugins.module_utils import pct

STARTUP = "startup for container '160' failed"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (f"Device /dev/nvidia1 does not exist\n{STARTUP}", "The node has no /dev/nvidia1"),
        (f"directory '/srv/models/x' does not exist\n{STARTUP}", "The bind-mount source /srv/models/x"),
        (f"bridge 'vmbr9' does not exist\n{STARTUP}", "The node has no bridge vmbr9"),
    ],
)
def test_explain_start_failure_names_the_fix(text: str, expected: str) -> None:
    assert expected in (pct.explain_start_failure(text) or "")


def test_explain_start_failure_unknown_reason() -> None:
    assert pct.explain_start_failure(f"something else\n{STARTUP}") is None


def test_start_commands_are_argv() -> None:
    assert pct.status_command(160) == ["/usr/sbin/pct", "status", "160"]
    assert pct.start_command(160) == ["/usr/sbin/pct", "start", "160"]
