"""Fixtures for the provisioning suite: ansible-playbook runs against the real testbed with an
inventory written per test. Provisioning tests use vmids 120-139."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"


@dataclass
class PlaybookRun:
    rc: int
    output: str

    def recap(self) -> dict[str, dict[str, int]]:
        """PLAY RECAP counters per host."""
        out: dict[str, dict[str, int]] = {}
        for host, counters in re.findall(r"^(\S+)\s+:\s+(ok=.*)$", self.output, re.M):
            out[host] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", counters)}
        return out

    def changed(self) -> int:
        return sum(c.get("changed", 0) for c in self.recap().values())


def container(vmid: int, **fields: Any) -> dict[str, Any]:
    entry = {"vmid": vmid, "hostname": f"t-{vmid}", "cores": 1, "memory_mb": 2048, "disk_gb": 16}
    entry.update(gpus="all", profile="torch211-triton36")
    entry.update(fields)
    return entry


def make_runner(workdir: Path) -> Callable[..., PlaybookRun]:
    """A runner of the repo's playbooks against the testbed node, with the testbed's group_vars and
    the given containers: run(name, containers, **extra_vars)."""

    def run(
        playbook: str, containers: list[dict[str, Any]], timeout: int = 1800, **extra: Any
    ) -> PlaybookRun:
        inventory = workdir / "inventory"
        inventory.mkdir(exist_ok=True)
        group_vars = inventory / "group_vars"
        if not group_vars.exists():
            group_vars.symlink_to(REPO / "inventory" / "testbed" / "group_vars")
        hosts = {
            "testbed": {"ansible_host": "127.0.0.1", "ansible_port": 2222, "mlstack_containers": containers}
        }
        (inventory / "hosts.yml").write_text(
            yaml.safe_dump({"all": {"children": {"pve_hosts": {"hosts": hosts}}}})
        )
        argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(inventory), str(REPO / "playbooks" / playbook)]
        if extra:
            argv += ["-e", json.dumps(extra)]
        env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
        env["PATH"] = f"{VENV_BIN}:{env['PATH']}"
        proc = subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO, check=False
        )
        return PlaybookRun(proc.returncode, proc.stdout + proc.stderr)

    return run


@pytest.fixture
def run_playbook(tmp_path: Path, testbed: Any) -> Callable[..., PlaybookRun]:
    """make_runner for one test."""
    return make_runner(tmp_path)


@pytest.fixture(scope="session")
def testbed() -> Any:
    """The testbed, brought up (idempotently) by the testbed suite's own fixture logic."""
    import sys

    sys.path.insert(0, str(REPO / "testbed"))
    sys.path.insert(0, str(REPO / "tests" / "testbed"))
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
