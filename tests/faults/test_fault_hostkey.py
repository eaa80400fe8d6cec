"""SSH host keys are checked on both links: the node's (OpenSSH, the inventory's known_hosts) and the
containers' (the pinned key of gpu_container, in ~/.ssh/known_hosts, checked by the container
connection whatever the node link's own known_hosts says). A node that
presents another key than the pinned one is refused before anything runs there. Each case goes
through a forwarder on a port of its own, so the pinned lines it leaves are its own to remove."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faultlib import Link, one_line, run, venv_works


@pytest.fixture
def link(testbed: Any) -> Iterator[Link]:
    forwarder = Link(int(testbed.ssh_port))
    yield forwarder
    forwarder.close()
    run(
        ["ssh-keygen", "-R", f"[127.0.0.1]:{forwarder.port}", "-f", str(Path.home() / ".ssh" / "known_hosts")]
    )


def key_line(port: int, pub: Path) -> str:
    kind, key = pub.read_text().split()[:2]
    return f"[127.0.0.1]:{port} {kind} {key}"


@pytest.fixture
def impostor_key(tmp_path: Path) -> Path:
    r = run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "impostor")])
    assert r.returncode == 0, r.stderr
    return tmp_path / "impostor.pub"


def test_node_with_another_host_key_is_refused(
    runner: Any, shared_ct: dict[str, Any], testbed: Any, link: Link, impostor_key: Path, tmp_path: Path
) -> None:
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(key_line(link.port, impostor_key) + "\n")
    result = runner(
        "provision.yml",
        [shared_ct],
        ansible_port=link.port,
        ansible_ssh_common_args=f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes",
    )
    assert result.rc != 0
    assert "Host key verification failed" in one_line(result.output), result.output[-3000:]
    assert result.changed() == 0, result.changed_tasks()


@pytest.mark.slow
def test_container_link_with_another_host_key_is_refused(
    runner: Any, shared_ct: dict[str, Any], testbed: Any, link: Link, impostor_key: Path, tmp_path: Path
) -> None:
    """The node's own link is right; the key pinned for the container connection is not."""
    real = Path(testbed.state_dir) / "ssh" / "ssh_host_ed25519_key.pub"
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(key_line(link.port, real) + "\n")
    result = runner(
        "provision.yml",
        [shared_ct],
        ansible_port=link.port,
        ansible_ssh_common_args=f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes",
        mlstack_pve_host_key=key_line(link.port, impostor_key),
        doctor_tier="quick",
    )
    text = one_line(result.output)
    assert result.rc != 0
    assert "UNREACHABLE!" in result.output and f"testbed-ct{shared_ct['vmid']}" in text, result.output[-3000:]
    # OpenSSH's refusal (mlstack.pve.pct_ssh), or paramiko's (community.proxmox.proxmox_pct_remote).
    assert "Host key verification failed" in text or "host key mismatch for 127.0.0.1" in text, result.output[
        -3000:
    ]
    ct_play = result.output.split("PLAY [Install and verify the ML stack")[-1]
    assert f"changed: [testbed-ct{shared_ct['vmid']}]" not in ct_play
    assert venv_works(int(shared_ct["vmid"]))
