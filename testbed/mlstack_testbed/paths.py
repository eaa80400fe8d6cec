"""Where the testbed keeps its state, and the names the rest of the project relies on."""

import json
import os
from pathlib import Path
from typing import Any

STATE_DIR = Path(os.environ.get("MLSTACK_TESTBED_STATE", "/var/lib/mlstack-testbed"))
TESTBED_JSON = STATE_DIR / "testbed.json"
RUN_DIR = STATE_DIR / "run"
LOG_DIR = STATE_DIR / "log"
SECRETS_DIR = STATE_DIR / "secrets"
TLS_DIR = STATE_DIR / "tls"
SSH_DIR = STATE_DIR / "ssh"
SBIN_DIR = STATE_DIR / "sbin"
API_STATE = STATE_DIR / "api-state.json"
GPU_NODES_FILE = STATE_DIR / "gpu-nodes.json"
# The GPU model the stand-in nvidia-smi reports, and its recorded answer (absent: no driver).
GPU_MODEL_FILE = STATE_DIR / "gpu-model"
GPU_ANSWER_FILE = STATE_DIR / "nvidia-smi.csv"
# The NVIDIA kernel module the nodes report (`up --driver-version`): nvidia/version here (absent: no
# driver), this folder bound over /proc/driver in each node's sshd mount namespace (nvdriver.py).
DRIVER_PROC_DIR = STATE_DIR / "proc-driver"
# Each snapshot's rootfs copy: SNAPSHOTS_DIR/<vmid>/<name>/rootfs, beside the API's state.
SNAPSHOTS_DIR = STATE_DIR / "snapshots"
# pct's direct backend (no API server): one PVE-format config per container, as /etc/pve/lxc/<vmid>.conf.
DIRECT_DIR = STATE_DIR / "direct"
# The storage 'local' (type dir) lives here, as /var/lib/vz does on PVE.
LOCAL_STORAGE = STATE_DIR / "storage" / "local"
TEMPLATE_CACHE = LOCAL_STORAGE / "template" / "cache"

API_HOST = "127.0.0.1"
API_PORT = int(os.environ.get("MLSTACK_TESTBED_API_PORT", "8006"))
API_USER = "root@pam"
# The cluster's first node. Every node's stand-in pct runs with MLSTACK_TESTBED_NODE set to its own name.
FIRST_NODE = "testbed"
NODE = os.environ.get("MLSTACK_TESTBED_NODE", FIRST_NODE)
SSH_HOST = "127.0.0.1"
SSH_PORT = int(os.environ.get("MLSTACK_TESTBED_SSH_PORT", "2222"))
SSH_USER = "root"
STORAGE = "local"
BRIDGE = "vmbr0"
HOST_BRIDGE = "lxcbr0"
TEMPLATE_NAME = "debian-12-testbed_amd64.tar.zst"
TEMPLATE_VOLID = f"{STORAGE}:vztmpl/{TEMPLATE_NAME}"
TEMPLATE_SUITE = "bookworm"

LXC_PATH = Path("/var/lib/lxc")
# Unprivileged containers: PVE's default map.
IDMAP_BASE = 100000
IDMAP_SIZE = 65536

API_PASSWORD_FILE = SECRETS_DIR / "api-password"
API_CERT = TLS_DIR / "api.crt"
API_KEY = TLS_DIR / "api.key"
SSH_HOST_KEY = SSH_DIR / "ssh_host_ed25519_key"
SSH_CLIENT_KEY = SSH_DIR / "id_ed25519"
SSH_AUTHORIZED_KEYS = SSH_DIR / "authorized_keys"
SSH_KNOWN_HOSTS = SSH_DIR / "known_hosts"
SSHD_CONFIG = SSH_DIR / "sshd_config"
API_PIDFILE = RUN_DIR / "api.pid"
SSHD_PIDFILE = RUN_DIR / "sshd.pid"
LXC_NET_MARKER = RUN_DIR / "lxc-net.started"
# The cluster's node names, in order (`up --nodes N`); absent: the first node alone.
NODES_FILE = STATE_DIR / "nodes.json"
# Each further node's own host key, sshd_config, pidfile and /usr/sbin stand-ins.
NODES_DIR = STATE_DIR / "nodes"
# A line for [127.0.0.1]:2222 placed in the system known_hosts file so Ansible and paramiko verify it.
SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")

TESTBED_DIR = Path(__file__).resolve().parent.parent
REPO_DIR = TESTBED_DIR.parent


# API access beyond the root@pam password login (PVE's user.cfg and priv/token.cfg): roles, tokens and
# ACL entries in access.json; each token's secret alone in secrets/tokens/<user>/<token name> (0600).
ACCESS_FILE = STATE_DIR / "access.json"
TOKENS_DIR = SECRETS_DIR / "tokens"
# The privilege-separated token `up` makes, granted only what the project's API calls need.
API_TOKEN_NAME = "mlstack"
API_TOKEN_ID = f"{API_USER}!{API_TOKEN_NAME}"
API_TOKEN_SECRET_FILE = TOKENS_DIR / API_USER / API_TOKEN_NAME
# pveam's catalogue index and its cache of the templates it built (debootstrap), one per suite.
PVEAM_DIR = STATE_DIR / "pveam"


def host_root() -> Path:
    """The nodes' host root (pve_host_root's default): the nodes share this machine's folder."""
    import yaml

    defaults = yaml.safe_load((REPO_DIR / "roles" / "pve_host" / "defaults" / "main.yml").read_text())
    return Path(defaults["pve_host_root"])


def lxc_config_dir() -> str:
    """LXC's shipped config dir: /usr/share/lxc/config, or a private prefix's ($MLSTACK_LXC_CONFIG_DIR)."""
    return os.environ.get("MLSTACK_LXC_CONFIG_DIR") or "/usr/share/lxc/config"


def venv_python() -> str:
    """The controller venv's interpreter: $MLSTACK_VENV/bin/python, else the repo's .venv."""
    venv = os.environ.get("MLSTACK_VENV")
    if venv:
        return str(Path(venv) / "bin" / "python")
    return str(REPO_DIR / ".venv" / "bin" / "python")


def ensure_dirs() -> None:
    for d in (STATE_DIR, RUN_DIR, LOG_DIR, TLS_DIR, SBIN_DIR, TEMPLATE_CACHE):
        d.mkdir(parents=True, exist_ok=True)
    for d in (SECRETS_DIR, SSH_DIR):
        d.mkdir(parents=True, exist_ok=True)
        d.chmod(0o700)
    STATE_DIR.chmod(0o755)


def node_names(count: int) -> list[str]:
    """The names of a cluster of `count` nodes: testbed, testbed2, testbed3, ..."""
    return [FIRST_NODE] + [f"{FIRST_NODE}{i}" for i in range(2, count + 1)]


def cluster_nodes() -> list[str]:
    """The nodes of the running cluster, as `up` last recorded them."""
    try:
        names = json.loads(NODES_FILE.read_text())["nodes"]
    except (OSError, ValueError, KeyError):
        return [FIRST_NODE]
    return [str(n) for n in names] or [FIRST_NODE]


def saved_cts() -> list[dict[str, Any]]:
    """The containers the API server saved last (api-state.json: vmid, node, config, ...); none before
    its first save."""
    if not API_STATE.is_file():
        return []
    return list(json.loads(API_STATE.read_text()).get("cts", []))
