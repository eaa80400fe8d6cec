"""Faults while the venv is built, on the shared CT, with the build moved aside (ml_venv_root and
ml_venv_venvs_dir, not activated) so the working venv stays in place and must keep working:

- the SSH link to the node killed while the venv build runs (a forwarder only this run uses); the
  build then runs `uv sync` in the container with the link gone;
- the disk filling up during the build (a small tmpfs on the venvs folder, inside the container only).

After each: no venv without its completion marker, the active venv untouched and working, and a rerun
that completes. Venvs live in the shared uv store (hard links from the cache), as the real ones do."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from faultlib import Link, ct_ls, ct_sh, one_line, run, venv_works, wait_for
from playbook_runner import PlaybookRun

ROOT = "/opt/mlstack-faults"
STORE_VENVS = "/var/cache/mlstack/uv/venvs"


def profile_env(vmid: int) -> str:
    return ct_sh(vmid, "cat /etc/profile.d/mlstack.sh; readlink /opt/mlstack/venv").stdout


def untrusted_venvs(vmid: int, venvs: str) -> list[str]:
    """Folders in `venvs` that look like a venv but lack the completion marker."""
    names = [n for n in ct_ls(vmid, venvs) if not n.endswith((".partial", ".lock"))]
    return [n for n in names if ct_sh(vmid, f"test -f {venvs}/{n}/.mlstack-complete").returncode != 0]


def aside(venvs: str) -> dict[str, Any]:
    """Extra vars that build the profile's venv in `venvs` (tools under ROOT), not making it active."""
    return {
        "ml_venv_root": ROOT,
        "ml_venv_venvs_dir": venvs,
        "ml_venv_activate": False,
        "ml_venv_prune": False,
        "doctor_tier": "quick",
    }


@pytest.fixture
def ssh_link(testbed: Any, tmp_path: Path) -> Iterator[tuple[Link, dict[str, Any]]]:
    """A forwarder to the node's sshd, and the extra vars that send every SSH connection of a run (the
    node's and the containers') through it, host keys checked against the node's pinned key."""
    link = Link(int(testbed.ssh_port))
    key = (Path(testbed.state_dir) / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()
    line = f"[127.0.0.1]:{link.port} {key[0]} {key[1]}"
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(line + "\n")
    extra = {
        "ansible_port": link.port,
        "ansible_ssh_common_args": f"-o UserKnownHostsFile={known_hosts} -o StrictHostKeyChecking=yes",
        "mlstack_pve_host_key": line,
    }
    yield link, extra
    link.close()
    # gpu_container pinned the forwarder's name in ~/.ssh/known_hosts for paramiko: take it out again.
    run(["ssh-keygen", "-R", f"[127.0.0.1]:{link.port}", "-f", str(Path.home() / ".ssh" / "known_hosts")])


@contextmanager
def build_lock_held(vmid: int, lock: str) -> Iterator[Callable[[], None]]:
    """Another build of the same venv, as mlstack-build-venv sees it: a process in the container holding
    the venv's build lock until released. A build started meanwhile waits on the lock, so the test can
    act while the build step is surely running (a warm-cache `uv sync` is over in a second)."""
    release = f"{lock}.release"
    ct_sh(vmid, f"rm -f {release}")
    # In the foreground of its own lxc-attach, so nothing but the release ends it.
    holder = subprocess.Popen(
        ["lxc-attach", "-n", str(vmid), "--clear-env", "--", "flock", lock, "sh", "-c",
         f"while [ ! -e {release} ]; do sleep 0.2; done"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip

    def let_go() -> None:
        ct_sh(vmid, f"touch {release}")

    try:
        held = wait_for(
            lambda: ct_sh(vmid, f"flock -n {lock} true").returncode != 0 or holder.poll() is not None, 60, 0.2
        )
        assert held and holder.poll() is None, (
            f"could not hold {lock}: {holder.stderr.read() if holder.stderr else ''}"
        )
        yield let_go
    finally:
        let_go()
        try:
            holder.wait(30)
        except subprocess.TimeoutExpired:
            holder.kill()
        ct_sh(vmid, f"rm -f {release}")


@pytest.mark.slow
def test_ssh_link_killed_during_venv_build(
    runner: Any, shared_ct: dict[str, Any], ssh_link: tuple[Link, dict[str, Any]]
) -> None:
    vmid, venvs = int(shared_ct["vmid"]), f"{STORE_VENVS}/ct160-faults-ssh"
    link, via_link = ssh_link
    env_before = profile_env(vmid)
    venv_id = ct_sh(vmid, "basename $(readlink -f /opt/mlstack/venv)").stdout.strip()
    ct_sh(vmid, f"rm -rf {venvs} && mkdir -p {venvs}")
    results: dict[str, Any] = {}
    with build_lock_held(vmid, f"{venvs}/{venv_id}.lock") as let_go:

        def provision() -> None:
            results["cut"] = runner("provision.yml", [shared_ct], **via_link, **aside(venvs))

        thread = threading.Thread(target=provision)
        thread.start()
        try:

            def building() -> bool:
                return ct_sh(vmid, f"pgrep -f '{ROOT}/bin/[m]lstack-build-venv' >/dev/null").returncode == 0

            wait_for(lambda: building() or not thread.is_alive(), 600, 0.5)
            so_far = results.get("cut", PlaybookRun(0, "")).output[-3000:]
            assert building(), "the venv build never started: " + so_far

            def waiting() -> bool:
                """The build waits for the held lock (its `flock -w SECONDS 9`)."""
                return ct_sh(vmid, "pgrep -f '^flock -w [0-9]+ 9$' >/dev/null").returncode == 0

            assert wait_for(lambda: waiting() or not thread.is_alive(), 120, 0.2) and waiting(), (
                "the venv build did not wait for the held lock: "
                + results.get("cut", PlaybookRun(0, "")).output[-3000:]
            )
            link.cut()
            cut_at = time.monotonic()
            # The build goes on without the link: `uv sync` runs in the container after the cut.
            let_go()
        finally:
            thread.join(900)
    cut = results["cut"]

    # What the user saw: the container unreachable at the build, with the connection's own error.
    assert cut.rc != 0
    assert "UNREACHABLE!" in cut.output, cut.output[-3000:]
    assert "Build the venv from the lock" in cut.output.split("UNREACHABLE!")[0].rsplit("TASK [", 1)[-1]
    # OpenSSH's words (mlstack.pve.pct_ssh: a new connection refused, or the kept one closed under a
    # command), or paramiko's (community.proxmox.proxmox_pct_remote).
    said = one_line(cut.output)
    assert (
        f"connect to host 127.0.0.1 port {link.port}" in said
        or f"SSH to node 127.0.0.1 port {link.port} failed: Connection to 127.0.0.1 closed" in said
        or f"Unable to connect to port {link.port} on 127.0.0.1" in said
    ), cut.output[-3000:]
    assert time.monotonic() - cut_at < 120, "the run did not notice the link was gone"
    # State: the working venv untouched; no venv without its marker (the build, left running in the
    # container by the async task, is still in its .partial folder or complete).
    assert profile_env(vmid) == env_before
    assert venv_works(vmid)
    assert untrusted_venvs(vmid, venvs) == []

    # Link back: a rerun waits for the orphaned build (or finds it complete) and completes.
    link.restore()
    again = runner("provision.yml", [shared_ct], **via_link, **aside(venvs))
    assert again.rc == 0, again.output[-4000:]
    built = [n for n in ct_ls(vmid, venvs) if not n.endswith(".lock")]
    assert len(built) == 1 and not built[0].endswith(".partial"), built
    assert venv_works(vmid, f"{venvs}/{built[0]}")
    assert profile_env(vmid) == env_before
    ct_sh(vmid, f"rm -rf {venvs}")


@pytest.fixture
def small_disk(shared_ct: dict[str, Any]) -> Iterator[str]:
    """A 256 MiB tmpfs on a venvs folder of the store, mounted inside the shared CT only: room for a few
    files, not for torch."""
    vmid, venvs = int(shared_ct["vmid"]), f"{STORE_VENVS}/ct160-faults-disk"
    r = ct_sh(
        vmid, f"rm -rf {venvs} && mkdir -p {venvs} && mount -t tmpfs -o size=256m mlstack-faults {venvs}"
    )
    assert r.returncode == 0, r.stderr
    yield venvs
    ct_sh(vmid, f"umount {venvs} 2>/dev/null; rm -rf {venvs}")


@pytest.mark.slow
def test_disk_full_during_the_venv_build(runner: Any, shared_ct: dict[str, Any], small_disk: str) -> None:
    vmid, venvs = int(shared_ct["vmid"]), small_disk
    env_before = profile_env(vmid)
    full = runner("provision.yml", [shared_ct], **aside(venvs))

    # What the user saw: the build failed, named the full disk and what to do.
    text = one_line(full.output)
    assert full.rc != 0
    assert f"no space left on the filesystem of {venvs}" in text, full.output[-4000:]
    assert "free space or grow the filesystem mounted there" in text
    # State: the partial venv removed (the space is free again), the active venv untouched and working.
    assert [n for n in ct_ls(vmid, venvs) if n.endswith(".partial")] == []
    assert untrusted_venvs(vmid, venvs) == []
    used_kb = int(ct_sh(vmid, f"df -Pk {venvs} | awk 'NR == 2 {{ print $3 }}'").stdout.strip())
    assert used_kb < 16 * 1024, f"{used_kb} KiB still used on the full disk"
    assert profile_env(vmid) == env_before
    assert venv_works(vmid)

    # Space made (the tmpfs gone: the store has room): a rerun builds the venv and completes.
    assert ct_sh(vmid, f"umount {venvs}").returncode == 0
    again = runner("provision.yml", [shared_ct], **aside(venvs))
    assert again.rc == 0, again.output[-4000:]
    built = [n for n in ct_ls(vmid, venvs) if not n.endswith(".lock")]
    assert len(built) == 1 and not built[0].endswith(".partial"), built
    assert venv_works(vmid, f"{venvs}/{built[0]}")
    assert profile_env(vmid) == env_before
