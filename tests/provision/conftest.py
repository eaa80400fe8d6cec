"""Fixtures for the provisioning suite: ansible-playbook runs against the real testbed with an
inventory written per test. Provisioning tests use vmids 120-139."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playbook_runner import PlaybookRun, make_runner


@pytest.fixture
def run_playbook(tmp_path: Path, testbed: Any) -> Callable[..., PlaybookRun]:
    """make_runner for one test."""
    return make_runner(tmp_path)


@pytest.fixture
def api(testbed: Any) -> Any:
    """A fresh API login per test (a ticket does not outlive an API server restart)."""
    return testbed.proxmox()


@pytest.fixture
def foreign_ct(api: Any, testbed: Any) -> Iterator[int]:
    """CT 139 created straight through the API without this project's tag: somebody else's."""
    from tbhelpers import remove_ct, wait_ok

    vmid = 139
    remove_ct(api, testbed, vmid)
    upid = api.nodes(testbed.node).lxc.post(
        vmid=vmid, ostemplate=testbed.template, hostname="not-ours", storage=testbed.storage, unprivileged=1
    )
    wait_ok(api, testbed, upid)
    yield vmid
    remove_ct(api, testbed, vmid)
