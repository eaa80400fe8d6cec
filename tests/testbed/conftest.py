"""Fixtures for the testbed suite: the testbed itself (brought up once, idempotently) and containers
that clean up after themselves. Test containers use vmids 900-949 only."""

import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "testbed"))

from mlstack_testbed import client  # noqa: E402
from tbhelpers import VENV_BIN, remove_ct, wait_ok  # noqa: E402

TESTBED = REPO / "testbed" / "testbed"
SHARE = Path("/var/tmp/mlstack-testbed-tests/share")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark this directory's tests `testbed` (and skip them when not root); other items are left alone."""
    here = Path(__file__).parent
    skip = pytest.mark.skip(reason="the testbed needs root (real LXC containers, sshd, device nodes)")
    for item in items:
        if here in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.testbed)
            if os.geteuid() != 0:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def api(testbed: client.Testbed) -> Any:
    return testbed.proxmox()


@pytest.fixture(scope="module")
def ansible_env(tmp_path_factory: pytest.TempPathFactory, testbed: client.Testbed) -> dict[str, str]:
    """A minimal ansible.cfg of the test's own (host key checking on) and TLS verified with the testbed CA."""
    home = tmp_path_factory.mktemp("ansible")
    cfg = home / "ansible.cfg"
    cfg.write_text(
        "[defaults]\nhost_key_checking = True\nretry_files_enabled = False\n"
        "interpreter_python = auto_silent\n"
    )
    return {
        **os.environ,
        "ANSIBLE_CONFIG": str(cfg),
        "ANSIBLE_STDOUT_CALLBACK": "json",
        "ANSIBLE_LOCAL_TEMP": str(home / "tmp"),
        "REQUESTS_CA_BUNDLE": testbed.api_ca_file,
        # This checkout as the collection mlstack.pve (make venv links it there).
        "ANSIBLE_COLLECTIONS_PATH": str(VENV_BIN.parent / "collections"),
        "PATH": f"{VENV_BIN}:{os.environ['PATH']}",
    }


@pytest.fixture
def cleanup(api: Any, testbed: client.Testbed) -> Iterator[Callable[[int], int]]:
    """cleanup(vmid) registers a test container for removal at the end of the test."""
    vmids: list[int] = []

    def register(vmid: int) -> int:
        assert 900 <= vmid <= 949, "testbed tests use vmids 900-949"
        remove_ct(api, testbed, vmid)  # leftovers of an interrupted run
        vmids.append(vmid)
        return vmid

    yield register
    for vmid in vmids:
        remove_ct(api, testbed, vmid)


@pytest.fixture(scope="session")
def share_dir() -> Path:
    SHARE.mkdir(parents=True, exist_ok=True)
    (SHARE / "hello.txt").write_text("hello from the host\n")
    return SHARE


@pytest.fixture(scope="session")
def ct900(api: Any, testbed: client.Testbed, share_dir: Path) -> Iterator[dict[str, Any]]:
    """CT 900: unprivileged, from the template, dev0 (/dev/nvidia0) and an mp0 bind mount, running."""
    vmid = 900
    remove_ct(api, testbed, vmid)
    t0 = time.monotonic()
    lxc = api.nodes(testbed.node).lxc
    wait_ok(
        api,
        testbed,
        lxc.post(
            vmid=vmid,
            ostemplate=testbed.template,
            hostname="tb900",
            storage=testbed.storage,
            unprivileged=1,
            memory=1024,
            cores=2,
            net0="name=eth0,bridge=vmbr0,ip=dhcp",
        ),
    )
    lxc(vmid).config.put(dev0="/dev/nvidia0,gid=44,mode=0666", mp0=f"{share_dir},mp=/mnt/share")
    wait_ok(api, testbed, lxc(vmid).status.start.post())
    info = {"vmid": vmid, "create_to_running_s": round(time.monotonic() - t0, 1)}
    print(f"\nCT {vmid}: create -> running in {info['create_to_running_s']} s", file=sys.stderr)
    yield info
    remove_ct(api, testbed, vmid)
