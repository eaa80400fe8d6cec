"""Connection info of a running testbed (testbed.json), for tests, tools and the `pct` CLI."""

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import paths


@dataclass(frozen=True)
class Testbed:
    api_host: str
    api_port: int
    node: str
    api_user: str
    api_password_file: str
    api_ca_file: str
    ssh_host: str
    ssh_port: int
    ssh_user: str
    ssh_key_file: str
    ssh_known_hosts_file: str
    template: str
    storage: str
    bridge: str
    host_bridge: str
    gpu_nodes: list[str]
    state_dir: str
    # The cluster's nodes ({name, ssh_host, ssh_port}), the first node above included.
    nodes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def api_password(self) -> str:
        return Path(self.api_password_file).read_text().strip()

    def proxmox(self, timeout: int = 60) -> Any:
        """A proxmoxer ProxmoxAPI logged in as root@pam, verifying TLS with the testbed's CA file."""
        from proxmoxer import ProxmoxAPI

        return ProxmoxAPI(
            self.api_host,
            port=self.api_port,
            user=self.api_user,
            password=self.api_password,
            verify_ssl=self.api_ca_file,
            timeout=timeout,
        )


def load(path: Path = paths.TESTBED_JSON) -> Testbed:
    data = json.loads(path.read_text())
    fields = Testbed.__dataclass_fields__
    tb = Testbed(**{k: v for k, v in data.items() if k in fields})
    if not tb.nodes:  # written before the testbed was a cluster: its one node
        tb.nodes.append({"name": tb.node, "ssh_host": tb.ssh_host, "ssh_port": tb.ssh_port})
    return tb


def wait_task(api: Any, node: str, upid: str, timeout: float = 300) -> dict[str, Any]:
    """Poll a task until it stops; returns its status (exitstatus 'OK' on success)."""
    deadline = time.monotonic() + timeout
    while True:
        status: dict[str, Any] = api.nodes(node).tasks(upid).status.get()
        if status.get("status") == "stopped":
            return status
        if time.monotonic() > deadline:
            raise TimeoutError(f"task {upid} still running after {timeout}s")
        time.sleep(0.2)


def task_log(api: Any, node: str, upid: str) -> list[str]:
    return [str(line.get("t", "")) for line in api.nodes(node).tasks(upid).log.get(limit=500)]
