"""A real sshd on 127.0.0.1:2222 with key-only root login and a pinned host key, running in a private
mount namespace where /usr/sbin shows the testbed's `pct`, `pveversion` and `nvidia-smi` on top of the
machine's own /usr/sbin (a read-only overlay: the machine's /usr/sbin is never written)."""

import shlex
import sys
from pathlib import Path

from . import daemons, paths
from .proc import run

MARKER = str(paths.SSHD_CONFIG)


def _keygen(path: Path, comment: str) -> None:
    if not path.is_file():
        r = run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)], timeout=30)
        if not r.ok:
            raise RuntimeError(f"ssh-keygen failed: {r.detail()}")
    path.chmod(0o600)


def known_hosts_line() -> str:
    key = (paths.SSH_HOST_KEY.with_suffix(".pub")).read_text().split()
    return f"[{paths.SSH_HOST}]:{paths.SSH_PORT} {key[0]} {key[1]}"


def prepare() -> bool:
    """Keys, authorized_keys, known_hosts, sshd_config, and the scripts shown in /usr/sbin; True when
    a script was new or changed (a running sshd's overlay may not show it: restart it)."""
    _keygen(paths.SSH_HOST_KEY, "mlstack-testbed-host")
    _keygen(paths.SSH_CLIENT_KEY, "mlstack-testbed-client")
    pub = paths.SSH_CLIENT_KEY.with_suffix(".pub").read_text().strip()
    paths.SSH_AUTHORIZED_KEYS.write_text(pub + "\n")
    paths.SSH_AUTHORIZED_KEYS.chmod(0o600)
    paths.SSH_KNOWN_HOSTS.write_text(known_hosts_line() + "\n")
    paths.SSHD_CONFIG.write_text(
        "\n".join(
            [
                "# mlstack-testbed sshd: loopback only, root by key only.",
                f"Port {paths.SSH_PORT}",
                f"ListenAddress {paths.SSH_HOST}",
                f"HostKey {paths.SSH_HOST_KEY}",
                f"PidFile {paths.RUN_DIR / 'sshd.real.pid'}",
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
    changed = False
    for name, module, func in (
        ("pct", "pct", "main"),
        ("pveversion", "pct", "pveversion_main"),
        ("nvidia-smi", "nvsmi", "main"),
        ("pveam", "pveam", "main"),
    ):
        script = paths.SBIN_DIR / name
        text = (
            "#!/bin/sh\n# mlstack-testbed stand-in for " + name + "\n"
            f"MLSTACK_TESTBED_STATE={state} PYTHONPATH={pythonpath} exec {py} -c "
            f"'import sys; from mlstack_testbed.{module} import {func}; sys.exit({func}())' \"$@\"\n"
        )
        if not script.is_file() or script.read_text() != text:
            script.write_text(text)
            changed = True
        script.chmod(0o755)
    return changed


def running() -> int | None:
    return daemons.pid_of(paths.SSHD_PIDFILE, MARKER)


def start() -> int:
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    r = run(["/usr/sbin/sshd", "-t", "-f", str(paths.SSHD_CONFIG)], timeout=30)
    if not r.ok:
        raise RuntimeError(f"sshd -t: {r.detail()}")
    inner = (
        f"mount -t overlay mlstack-testbed-sbin -o ro,lowerdir={paths.SBIN_DIR}:/usr/sbin /usr/sbin && "
        f"exec /usr/sbin/sshd -D -e -f {paths.SSHD_CONFIG}"
    )
    argv = ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", inner]
    return daemons.spawn(
        argv,
        paths.SSHD_PIDFILE,
        paths.LOG_DIR / "sshd.log",
        env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
    )


def stop() -> int | None:
    return daemons.stop(paths.SSHD_PIDFILE, MARKER)
