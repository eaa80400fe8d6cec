"""Fixtures for the provisioning suite: ansible-playbook runs against the real testbed with an
inventory written per test. Provisioning tests use vmids 120-139; CT 150 is the provisioned container that
the files which only read one share (default_ct)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from playbook_runner import DEFAULT_CT_VMID, PlaybookRun, container, make_runner


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


@pytest.fixture(scope="session")
def default_ct(tmp_path_factory: pytest.TempPathFactory, testbed: Any) -> Iterator[tuple[PlaybookRun, Any]]:
    """CT 150 provisioned once per session from a default entry, and the runner that made it: (its first
    run, run). The files that check a provisioned container (test_doctor_defaults.py, test_monitor.py)
    share it rather than each paying a first provision; a test that changes it puts it back."""
    from tbhelpers import remove_ct

    run = make_runner(tmp_path_factory.mktemp("default-ct"))
    entry = [container(DEFAULT_CT_VMID)]
    remove_ct(testbed.proxmox(), testbed, DEFAULT_CT_VMID)
    yield run("provision.yml", entry), run
    run("destroy.yml", entry, mlstack_destroy_confirm=True)
    remove_ct(testbed.proxmox(), testbed, DEFAULT_CT_VMID)
