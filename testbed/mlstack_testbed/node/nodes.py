"""The cluster's nodes. Each PVE node of the testbed is its own real sshd (its own loopback address and
host key) whose /usr/sbin shows `pct`, `pveversion`, `nvidia-smi` and `pveam` acting as that node. The
nodes share one API (the cluster's, as any PVE node serves the whole cluster), the machine's LXC (so
vmids are unique cluster-wide, as PVE's are) and root's key (PVE shares root's authorized_keys and
known_hosts cluster-wide through /etc/pve/priv)."""

import json
from dataclasses import dataclass
from pathlib import Path

from .. import paths

MAX_NODES = 16


@dataclass(frozen=True)
class Node:
    name: str
    index: int  # 1-based: node 1 keeps the paths and address the testbed always had

    @property
    def first(self) -> bool:
        return self.index == 1

    @property
    def ssh_host(self) -> str:
        # 127.0.0.0/8 is all loopback on Linux: one address per node, the same port on each, as hosts.
        return paths.SSH_HOST if self.first else f"127.0.0.{self.index}"

    @property
    def ssh_port(self) -> int:
        return paths.SSH_PORT

    @property
    def known_hosts_name(self) -> str:
        return f"[{self.ssh_host}]:{self.ssh_port}"

    @property
    def home(self) -> Path:
        return paths.SSH_DIR if self.first else paths.NODES_DIR / self.name

    @property
    def host_key(self) -> Path:
        return paths.SSH_HOST_KEY if self.first else self.home / "ssh_host_ed25519_key"

    @property
    def sshd_config(self) -> Path:
        return paths.SSHD_CONFIG if self.first else self.home / "sshd_config"

    @property
    def sbin(self) -> Path:
        return paths.SBIN_DIR if self.first else self.home / "sbin"

    @property
    def pidfile(self) -> Path:
        return paths.SSHD_PIDFILE if self.first else paths.RUN_DIR / f"sshd-{self.name}.pid"

    @property
    def real_pidfile(self) -> Path:
        return paths.RUN_DIR / ("sshd.real.pid" if self.first else f"sshd-{self.name}.real.pid")

    @property
    def log(self) -> Path:
        return paths.LOG_DIR / ("sshd.log" if self.first else f"sshd-{self.name}.log")


def cluster(count: int | None = None) -> list[Node]:
    """The nodes of a cluster of `count` nodes, or of the running one (as last recorded)."""
    names = paths.node_names(count) if count else paths.cluster_nodes()
    return [Node(name, i + 1) for i, name in enumerate(names)]


def record(count: int) -> bool:
    """Record the cluster's node names for the API and the tools; True when they changed."""
    if not 1 <= count <= MAX_NODES:
        raise RuntimeError(f"--nodes {count}: a testbed cluster has 1 to {MAX_NODES} nodes")
    names = paths.node_names(count)
    if paths.NODES_FILE.is_file() and paths.cluster_nodes() == names:
        return False
    tmp = paths.NODES_FILE.with_suffix(".tmp")
    tmp.write_text(json.dumps({"nodes": names}) + "\n")
    tmp.replace(paths.NODES_FILE)
    return True
