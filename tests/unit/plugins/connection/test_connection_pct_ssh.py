"""mlstack.pve.pct_ssh without a node: the ssh argv it builds, the quoting of the container's command,
and which exit-255 answers are the connection's. Its runs against a real sshd and pct are in
tests/testbed/test_ansible.py."""

from __future__ import annotations

import shlex
import subprocess
from typing import Any

import pytest
import yaml
from ansible import constants as C
from ansible.config.manager import ConfigManager
from ansible.errors import AnsibleConnectionFailure
from ansible.playbook.play_context import PlayContext
from ansible_collections.mlstack.pve.plugins.connection import pct_ssh

NAME = "mlstack.pve.pct_ssh"


@pytest.fixture
def conn(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    # The plugin's options as Ansible's loader registers them, from its DOCUMENTATION.
    config = ConfigManager()
    options = yaml.safe_load(pct_ssh.DOCUMENTATION)["options"]
    config.initialize_plugin_configuration_definitions("connection", NAME, options)
    monkeypatch.setattr(C, "config", config)
    plugin = pct_ssh.Connection(PlayContext(), None)
    plugin._load_name = NAME
    plugin.set_options(
        direct={
            "remote_addr": "node1.example",
            "port": 2222,
            "vmid": 160,
            "private_key_file": "/keys/id",
            "ssh_common_args": "-o UserKnownHostsFile=/elsewhere -o StrictHostKeyChecking=no",
            "known_hosts_file": "/pinned/known_hosts",
            "control_path_dir": str(tmp_path / "cp"),
        }
    )
    return plugin


def remote(argv: list[str]) -> list[str]:
    """The command the node's shell runs, split as that shell would."""
    return shlex.split(argv[-1])


def test_host_key_checks_come_before_the_users_options(conn: Any) -> None:
    argv = conn._ssh_argv("true")
    opts = [argv[i + 1] for i, a in enumerate(argv) if a == "-o"]
    # OpenSSH keeps the first value of an option: the plugin's checks win over ssh_common_args.
    assert opts.index("StrictHostKeyChecking=yes") < opts.index("StrictHostKeyChecking=no")
    assert opts.index("UserKnownHostsFile=/pinned/known_hosts") < opts.index("UserKnownHostsFile=/elsewhere")
    assert (
        "GlobalKnownHostsFile=/dev/null" in opts
        and "BatchMode=yes" in opts
        and any(o.startswith("ControlPersist=") for o in opts)
    )
    assert argv[-3:-1] == ["--", "node1.example"] and argv[argv.index("-p") + 1] == "2222"


@pytest.mark.parametrize("command", ["true; touch /on-node", "echo $(hostname) && cat '/a b'", "a'b\"c\\d"])
def test_the_whole_command_goes_to_the_containers_sh(conn: Any, command: str) -> None:
    node_side = remote(conn._ssh_argv(conn._in_container(command)))
    assert node_side == ["/usr/sbin/pct", "exec", "160", "--", "/bin/sh", "-c", command]


class Answer:
    def __init__(self, rc: int, stderr: bytes) -> None:
        self.returncode, self.stdout, self.stderr = rc, b"out", stderr


@pytest.mark.parametrize(
    ("stderr", "connection_failed"),
    [
        (b"ssh: connect to host node1.example port 2222: Connection refused\r\n", True),
        (b"Host key verification failed.\r\n", True),
        (b"root@node1.example: Permission denied (publickey).\r\n", True),
        (b"Connection to node1.example closed by remote host.\r\n", True),
        (b"Timeout, server node1.example not responding.\r\n", True),
        (b"mux_client_request_session: read from master failed: Broken pipe\r\n", True),
        (b"the command in the container said this\n", False),
        (b"", False),
    ],
)
def test_exit_255_is_the_connections_only_when_ssh_says_so(
    conn: Any, monkeypatch: pytest.MonkeyPatch, stderr: bytes, connection_failed: bool
) -> None:
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: Answer(255, stderr))
    if connection_failed:
        with pytest.raises(AnsibleConnectionFailure, match=r"node1\.example port 2222"):
            conn.exec_command("exit 255")
    else:
        assert conn.exec_command("exit 255") == (255, b"out", stderr)


def test_reset_reaches_the_node_again_or_fails_as_the_connection(
    conn: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Ansible calls reset() when a poll of an async task raised: a node still reachable lets it poll
    # again; one that is not ends the task as unreachable instead of polling until its time limit.
    calls: list[list[str]] = []

    def answer(rc: int, stderr: bytes) -> Any:
        def run(argv: list[str], **_: Any) -> Answer:
            calls.append(argv)
            return Answer(rc, stderr)

        return run

    monkeypatch.setattr(subprocess, "run", answer(0, b""))
    conn.reset()
    assert calls[-1][-1] == "true" and "pct" not in calls[-1][-1]
    refused = b"ssh: connect to host node1.example port 2222: Connection refused\r\n"
    monkeypatch.setattr(subprocess, "run", answer(255, refused))
    with pytest.raises(AnsibleConnectionFailure, match=r"node1\.example port 2222 failed: ssh: connect"):
        conn.reset()

    def hang(argv: list[str], **kw: Any) -> Answer:
        raise subprocess.TimeoutExpired(argv, kw["timeout"])

    monkeypatch.setattr(subprocess, "run", hang)
    with pytest.raises(AnsibleConnectionFailure, match=r"no answer within \d+ s"):
        conn.reset()
