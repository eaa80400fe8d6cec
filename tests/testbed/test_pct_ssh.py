"""The testbed's sshd and its pct: key-only root login, pinned host key, PVE 9 `pct` semantics."""

import hashlib
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from mlstack_testbed import client
from mlstack_testbed.lxc import realct
from tbhelpers import attach, run, ssh


def test_pct_is_not_on_the_machine(testbed: client.Testbed) -> None:
    assert not Path("/usr/sbin/pct").exists()
    assert not Path("/usr/sbin/pveversion").exists()
    r = ssh(testbed, "test -x /usr/sbin/pct && test -x /usr/sbin/pveversion && command -v pct")
    assert r.returncode == 0 and r.stdout.strip() == "/usr/sbin/pct", r.stderr


def test_pveversion(testbed: client.Testbed, api: Any) -> None:
    r = ssh(testbed, "pveversion")
    assert r.stdout.startswith(f"pve-manager/{api.version.get()['version']}/")


def test_password_login_refused(testbed: client.Testbed) -> None:
    r = run(
        [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            "PubkeyAuthentication=no",
            "-o",
            "StrictHostKeyChecking=yes",
            "-o",
            f"UserKnownHostsFile={testbed.ssh_known_hosts_file}",
            "-p",
            str(testbed.ssh_port),
            f"root@{testbed.ssh_host}",
            "true",
        ]
    )
    assert r.returncode == 255 and "Permission denied" in r.stderr


def test_host_key_is_pinned(testbed: client.Testbed, tmp_path: Path) -> None:
    wrong = tmp_path / "known_hosts"
    wrong.write_text(
        f"[{testbed.ssh_host}]:{testbed.ssh_port} ssh-ed25519 "
        "AAAAC3NzaC1lZDI1NTE5AAAAIHcI3Zl1JbSjPAbK0hYc5gI2SR3P8cKMkCk8e5LqJ5Ne\n"
    )
    r = ssh(testbed, "true", known_hosts=str(wrong))
    assert r.returncode == 255 and "HOST IDENTIFICATION HAS CHANGED" in r.stderr


def test_exec_propagates_exit_code(testbed: client.Testbed, ct900: dict[str, Any]) -> None:
    assert ssh(testbed, "pct exec 900 -- sh -c 'exit 7'").returncode == 7


def test_exec_clears_environment(testbed: client.Testbed, ct900: dict[str, Any]) -> None:
    r = ssh(testbed, "FOO=bar pct exec 900 -- env")
    names = {line.split("=", 1)[0] for line in r.stdout.splitlines()}
    assert "FOO" not in names and not any(n.startswith("SSH_") for n in names)
    assert "PATH" in names and "container" in names


def test_exec_passes_stdin(testbed: client.Testbed, ct900: dict[str, Any]) -> None:
    """As proxmox_pct_remote's put_file does: `sh -c 'cat > dst'` with the data on stdin."""
    data = "line one\nline two\n"
    r = ssh(testbed, "/usr/sbin/pct exec 900 -- /bin/sh -c 'cat > /root/stdin.txt'", stdin=data)
    assert r.returncode == 0, r.stderr
    assert attach(900, "cat /root/stdin.txt").stdout == data


def test_exec_wrong_vmid(testbed: client.Testbed) -> None:
    r = ssh(testbed, "pct exec 949 -- true")
    assert r.returncode == 255
    assert "Configuration file 'nodes/testbed/lxc/949.conf' does not exist" in r.stderr


def test_push_and_pull(testbed: client.Testbed, ct900: dict[str, Any], tmp_path: Path) -> None:
    src = tmp_path / "blob"
    src.write_bytes(os.urandom(200_000))
    remote = f"/var/tmp/push-{uuid.uuid4().hex}"
    r = ssh(testbed, f"pct push 900 {src} {remote} --perms 0640 --user nobody --group nogroup")
    assert r.returncode == 0, r.stderr
    assert attach(900, f"stat -c '%U %G %a' {remote}").stdout.split() == ["nobody", "nogroup", "640"]
    back = tmp_path / "back"
    r = ssh(testbed, f"pct pull 900 {remote} {back}")
    assert r.returncode == 0, r.stderr
    assert hashlib.sha256(back.read_bytes()).digest() == hashlib.sha256(src.read_bytes()).digest()


def test_status_and_config(testbed: client.Testbed, ct900: dict[str, Any]) -> None:
    assert ssh(testbed, "pct status 900").stdout.strip() == "status: running"
    config = ssh(testbed, "pct config 900").stdout
    assert "dev0: /dev/nvidia0,gid=44,mode=0666" in config.splitlines()
    assert "unprivileged: 1" in config.splitlines()


@pytest.mark.parametrize("unprivileged", [1, 0], ids=["unprivileged", "privileged"])
def test_pct_lifecycle(testbed: client.Testbed, cleanup: Any, share_dir: Path, unprivileged: int) -> None:
    """create, set (dev1, mp1), start, exec, stop, destroy: all through pct over SSH."""
    vmid = cleanup(920 + unprivileged)
    r = ssh(
        testbed,
        f"pct create {vmid} {testbed.template} --storage {testbed.storage} "
        f"--unprivileged {unprivileged} --hostname pct{vmid}",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert realct.exists(vmid)
    r = ssh(
        testbed,
        f"pct set {vmid} --dev1 path=/dev/nvidiactl,mode=0660,uid=0,gid=0 "
        f"--mp1 {share_dir},mp=/srv/share,ro=1",
    )
    assert r.returncode == 0, r.stderr
    assert ssh(testbed, f"pct start {vmid}", timeout=60).returncode == 0
    assert realct.state(vmid)[0] == "running"
    r = ssh(
        testbed,
        f"pct exec {vmid} -- sh -c 'stat -c %a /dev/nvidiactl; cat /srv/share/hello.txt; "
        "touch /srv/share/x 2>/dev/null && echo writable || echo readonly'",
    )
    assert r.stdout.split("\n") == ["660", "hello from the host", "readonly", ""], r.stderr
    assert ssh(testbed, f"pct stop {vmid}", timeout=60).returncode == 0
    assert realct.state(vmid)[0] == "stopped"
    assert ssh(testbed, f"pct destroy {vmid}", timeout=120).returncode == 0
    assert not realct.ct_dir(vmid).exists()


def test_pct_set_bad_device(testbed: client.Testbed, ct900: dict[str, Any]) -> None:
    r = ssh(testbed, "pct set 900 --dev5 /dev/nvidia42")
    assert r.returncode == 255 and "Device /dev/nvidia42 does not exist" in r.stderr
