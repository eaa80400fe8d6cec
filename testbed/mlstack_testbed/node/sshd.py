"""One real sshd per node (node 1 on 127.0.0.1:2222, node N on 127.0.0.N) with key-only root login and a
pinned host key, running in a private mount namespace where /usr/sbin shows the testbed's `pct`,
`pveversion`, `nvidia-smi`, `pveam`, `pvesm` and `nvidia-modprobe`, acting as that node, on top of the
machine's own /usr/sbin (a read-only overlay: the machine's /usr/sbin is never written)."""

import shlex
import sys
from pathlib import Path

from .. import paths
from ..proc import run
from . import daemons
from .nodes import Node


def _keygen(path: Path, comment: str) -> None:
    if not path.is_file():
        r = run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], timeout=30)
        if not r.ok:
            raise RuntimeError(f"ssh-keygen failed: {r.detail()}")
    path.chmod(0o600)


def known_hosts_line(node: Node) -> str:
    key = (node.host_key.with_suffix(".pub")).read_text().split()
    return f"{node.known_hosts_name} {key[0]} {key[1]}"


def pin_host_keys(cluster: list[Node]) -> None:
    """ssh/known_hosts: every node's line, as PVE's cluster-wide known_hosts holds them all."""
    paths.SSH_KNOWN_HOSTS.write_text("".join(known_hosts_line(n) + "\n" for n in cluster))


def prepare_client_key() -> None:
    """root's key, one for every node (PVE shares root's authorized_keys cluster-wide). authorized_keys
    is written only when it differs: a running sshd reads it at each login."""
    _keygen(paths.SSH_CLIENT_KEY, "mlstack-testbed-client")
    line = paths.SSH_CLIENT_KEY.with_suffix(".pub").read_text().strip() + "\n"
    if not paths.SSH_AUTHORIZED_KEYS.is_file() or paths.SSH_AUTHORIZED_KEYS.read_text() != line:
        paths.SSH_AUTHORIZED_KEYS.write_text(line)
    paths.SSH_AUTHORIZED_KEYS.chmod(0o600)


def prepare(node: Node) -> bool:
    """The node's host key, sshd_config, and the scripts shown in /usr/sbin; True when a script was
    new or changed (a running sshd's overlay may not show it: restart it)."""
    node.home.mkdir(parents=True, exist_ok=True)
    node.home.chmod(0o700)
    _keygen(node.host_key, f"mlstack-testbed-host-{node.name}" if not node.first else "mlstack-testbed-host")
    node.sshd_config.write_text(
        "\n".join(
            [
                f"# mlstack-testbed sshd of node {node.name}: loopback only, root by key only.",
                f"Port {node.ssh_port}",
                f"ListenAddress {node.ssh_host}",
                f"HostKey {node.host_key}",
                f"PidFile {node.real_pidfile}",
                f"AuthorizedKeysFile {paths.SSH_AUTHORIZED_KEYS}",
                "PermitRootLogin prohibit-password",
                "AllowUsers root",
                "PubkeyAuthentication yes",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "X11Forwarding no",
                "AllowTcpForwarding no",
                "PrintMotd no",
                "MaxStartups 64:30:128",
                "MaxSessions 64",
                "Subsystem sftp internal-sftp",
                "",
            ]
        )
    )
    py = shlex.quote(sys.executable)
    pythonpath = shlex.quote(str(paths.TESTBED_DIR))
    state = shlex.quote(str(paths.STATE_DIR))
    node_name = shlex.quote(node.name)
    node.sbin.mkdir(parents=True, exist_ok=True)
    changed = False
    for name, module, func in (
        ("pct", "pct", "main"),
        ("pveversion", "pct", "pveversion_main"),
        ("nvidia-smi", "nvsmi", "main"),
        ("pveam", "pveam", "main"),
        ("pvesm", "pvesm", "main"),
        ("nvidia-modprobe", "gpu", "modprobe_main"),
    ):
        script = node.sbin / name
        text = (
            "#!/bin/sh\n# mlstack-testbed stand-in for " + name + "\n"
            f"MLSTACK_TESTBED_STATE={state} MLSTACK_TESTBED_NODE={node_name} PYTHONPATH={pythonpath} "
            f"exec {py} -c "
            f"'import sys; from mlstack_testbed.node.{module} import {func}; sys.exit({func}())' \"$@\"\n"
        )
        if not script.is_file() or script.read_text() != text:
            script.write_text(text)
            changed = True
        script.chmod(0o755)
    return changed


def running(node: Node) -> int | None:
    return daemons.pid_of(node.pidfile, str(node.sshd_config))


def start(node: Node) -> int:
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    r = run(["/usr/sbin/sshd", "-t", "-f", str(node.sshd_config)], timeout=30)
    if not r.ok:
        raise RuntimeError(f"sshd -t: {r.detail()}")
    inner = (
        f"mount -t overlay mlstack-testbed-sbin -o ro,lowerdir={node.sbin}:/usr/sbin /usr/sbin && "
        f"exec /usr/sbin/sshd -D -e -f {node.sshd_config}"
    )
    argv = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", inner]
    return daemons.spawn(
        argv,
        node.pidfile,
        node.log,
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
    )


def stop(node: Node) -> int | None:
    return daemons.stop(node.pidfile, str(node.sshd_config))
