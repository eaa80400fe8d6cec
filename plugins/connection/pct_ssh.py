# Copyright (c) 2026 mlstack maintainers
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
"""Tasks inside a PVE container: `pct exec` on its node over one kept OpenSSH connection per node."""

from __future__ import annotations

DOCUMENTATION = r"""
name: pct_ssh
author: mlstack maintainers
short_description: Run tasks inside a Proxmox VE container over one kept SSH connection to its node
description:
  - >-
    Every command runs as C(pct exec VMID -- /bin/sh -c CMD) on the container's PVE node, through
    OpenSSH with a control master kept per node (ControlPersist), so every task and every container
    of a node share one authenticated connection.
  - >-
    Pipelining is on by default (the module goes in on stdin), so a task inside the container is one
    round trip to the node and one C(pct exec) there. Files are streamed through C(pct exec ... cat).
  - >-
    The whole command is quoted into C(/bin/sh -c), so nothing of it (C(raw) included) runs on the
    node itself. Host keys are always checked (StrictHostKeyChecking=yes, BatchMode=yes).
version_added: 0.1.0
options:
  remote_addr:
    description: Address of the PVE node.
    default: inventory_hostname
    type: str
    vars:
      - name: inventory_hostname
      - name: ansible_host
  port:
    description: SSH port of the node.
    default: 22
    type: int
    vars:
      - name: ansible_port
  remote_user:
    description: User on the node; C(pct) needs root.
    default: root
    type: str
    vars:
      - name: ansible_user
  private_key_file:
    description: SSH private key for the node.
    type: path
    vars:
      - name: ansible_ssh_private_key_file
      - name: ansible_private_key_file
  ssh_common_args:
    description: >-
      Extra OpenSSH arguments (e.g. C(-o UserKnownHostsFile=...)); they come after this
      plugin's own C(-o) options and cannot turn host key checking off.
    default: ""
    type: str
    vars:
      - name: ansible_ssh_common_args
  known_hosts_file:
    description: >-
      known_hosts file holding the node's pinned key (the gpu_container role pins
      mlstack_pve_host_key there). It is the only file checked, whatever ssh_common_args or the
      system-wide known_hosts say.
    default: ~/.ssh/known_hosts
    type: path
    vars:
      - name: mlstack_ssh_known_hosts_file
  vmid:
    description: The container's vmid on that node.
    required: true
    type: int
    vars:
      - name: proxmox_vmid
  pct_command:
    description: Path of C(pct) on the node.
    default: /usr/sbin/pct
    type: str
    vars:
      - name: mlstack_pct_command
  pipelining:
    description: Send modules on stdin instead of copying them first.
    default: true
    type: bool
    vars:
      - name: ansible_pipelining
  persist_seconds:
    description: Seconds the node's control master stays after the last command.
    default: 120
    type: int
    vars:
      - name: mlstack_ssh_persist_seconds
  control_path_dir:
    description: >-
      Folder of the control sockets (kept short: sockets have a path length limit). Not the node
      connection's own folder, so the container link always makes its own host key check.
    default: ~/.ansible/cp-pct
    type: path
    vars:
      - name: mlstack_ssh_control_path_dir
  timeout:
    description: Seconds to wait for the SSH connection to the node.
    default: 10
    type: int
    vars:
      - name: ansible_ssh_timeout
      - name: ansible_timeout
"""

import os
import re
import shlex
import subprocess
from typing import IO, Any

from ansible.errors import AnsibleConnectionFailure, AnsibleFileNotFound
from ansible.module_utils.common.text.converters import to_bytes, to_text
from ansible.plugins.connection import ConnectionBase
from ansible.utils.display import Display

display = Display()

# OpenSSH exits 255 for its own failures; a command in the container may too, so 255 counts as the
# connection's failure only when ssh says so.
# A kept connection that dies under a running command ends it with "Connection to HOST closed by
# remote host." (the node or the path went away) or "Timeout, server HOST not responding." (the
# keepalives below went unanswered): the connection's failures too, never the command's exit status.
SSH_FAILURE = re.compile(
    rb"^(ssh: |kex_exchange_identification|Connection (closed|reset|timed out)|Host key verification failed"
    rb"|.*Permission denied \(|.*REMOTE HOST IDENTIFICATION HAS CHANGED|No ED25519 host key is known"
    rb"|Control socket connect|Connection to \S+ closed|Timeout, server \S+ not responding|mux_client_)",
    re.M,
)


class Connection(ConnectionBase):
    """pct exec over a kept OpenSSH connection to the container's node."""

    transport = "mlstack.pve.pct_ssh"
    has_pipelining = True

    def _connect(self) -> Connection:
        self._connected = True
        return self

    def _ssh_argv(self, remote_command: str) -> list[str]:
        control_dir = os.path.expanduser(self.get_option("control_path_dir"))
        os.makedirs(control_dir, mode=0o700, exist_ok=True)
        argv = [
            "ssh",
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={os.path.expanduser(self.get_option('known_hosts_file'))}",
            # Only the pinned file: a matching key in the system-wide file would otherwise win over a
            # mismatch in the pinned one.
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "ControlMaster=auto",
            "-o", f"ControlPersist={self.get_option('persist_seconds')}",
            "-o", f"ControlPath={control_dir}/%C",
            "-o", f"ConnectTimeout={self.get_option('timeout')}",
            # A path that drops silently (no FIN, no RST) is noticed within 15 s, not at TCP's timeout.
            "-o", "ServerAliveInterval=5",
            "-o", "ServerAliveCountMax=3",
            "-p", str(self.get_option("port")),
            "-l", self.get_option("remote_user"),
        ]  # fmt: skip
        key = self.get_option("private_key_file")
        if key:
            argv += ["-i", os.path.expanduser(key)]
        # The user's options come last: OpenSSH takes the first value of an option, so they cannot
        # override the host key checks above.
        argv += shlex.split(self.get_option("ssh_common_args") or "")
        return [*argv, "--", self.get_option("remote_addr"), remote_command]

    def _in_container(self, command: str) -> str:
        """The node-side command line: `pct exec` with the whole command quoted for the container's sh."""
        pct, vmid = self.get_option("pct_command"), int(self.get_option("vmid"))
        return f"{shlex.quote(pct)} exec {vmid} -- /bin/sh -c {shlex.quote(command)}"

    def _run(
        self, command: str, stdin: bytes | IO[bytes] | None, stdout: Any = subprocess.PIPE
    ) -> tuple[int, bytes, bytes]:
        argv = self._ssh_argv(self._in_container(command))
        display.vvv(
            f"PCT_SSH {self.get_option('vmid')}: {shlex.join(argv)}", host=self.get_option("remote_addr")
        )
        return self._ssh(argv, stdin, stdout)

    def _ssh(
        self,
        argv: list[str],
        stdin: bytes | IO[bytes] | None = None,
        stdout: Any = subprocess.PIPE,
        timeout: float | None = None,
    ) -> tuple[int, bytes, bytes]:
        """Run ssh; its own failures (exit 255 with ssh's words, or no answer within `timeout`) are the
        connection's, anything else is the remote command's result."""
        data = stdin if isinstance(stdin, bytes) else None
        try:
            proc = subprocess.run(
                argv,
                input=data,
                stdin=None if data is not None else (stdin or subprocess.DEVNULL),
                stdout=stdout,
                stderr=subprocess.PIPE,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            raise self._node_failure(f"no answer within {exc.timeout:.0f} s") from exc
        out = proc.stdout if isinstance(proc.stdout, bytes) else b""
        if proc.returncode == 255 and SSH_FAILURE.search(proc.stderr or b""):
            raise self._node_failure(to_text(proc.stderr, errors="surrogate_or_replace").strip())
        return proc.returncode, out, proc.stderr

    def _node_failure(self, why: str) -> AnsibleConnectionFailure:
        return AnsibleConnectionFailure(
            f"SSH to node {self.get_option('remote_addr')} port {self.get_option('port')} failed: {why}"
        )

    def exec_command(
        self, cmd: str, in_data: bytes | None = None, sudoable: bool = True
    ) -> tuple[int, bytes, bytes]:
        super().exec_command(cmd, in_data=in_data, sudoable=sudoable)
        return self._run(cmd, in_data)

    def put_file(self, in_path: str, out_path: str) -> None:
        super().put_file(in_path, out_path)
        if not os.path.exists(to_bytes(in_path, errors="surrogate_or_strict")):
            raise AnsibleFileNotFound(f"file or module does not exist: {in_path}")
        with open(in_path, "rb") as source:
            rc, _, err = self._run(f"cat > {shlex.quote(out_path)}", source)
        if rc != 0:
            raise AnsibleConnectionFailure(f"failed to write {out_path} in container: {to_text(err).strip()}")

    def fetch_file(self, in_path: str, out_path: str) -> None:
        super().fetch_file(in_path, out_path)
        with open(out_path, "wb") as target:
            rc, _, err = self._run(f"cat -- {shlex.quote(in_path)}", None, stdout=target)
        if rc != 0:
            raise AnsibleConnectionFailure(f"failed to read {in_path} in container: {to_text(err).strip()}")

    def reset(self) -> None:
        """Reach the node again: the kept connection is reused or made anew (it is the node's, shared with
        other containers). Ansible calls this when a poll of an async task raised; a node that cannot be
        reached fails here as the connection's failure, so the task is unreachable at once instead of
        polling a dead link until its time limit."""
        self._ssh(self._ssh_argv("true"), timeout=int(self.get_option("timeout")) + 15)

    def close(self) -> None:
        self._connected = False
