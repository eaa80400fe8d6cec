"""An apt lock held by another process inside the container, on the shared CT. apt is made to need
the lock by asking for one more small package (tree) than the toolchain has.

First the lock is held past a short bound: the run gives up after that bound (no retries of a lock
timeout) and names the lock and its holder. Then the rerun starts with the lock still held and the
holder lets go while apt waits: apt takes the lock and the run completes."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from faultlib import ct_sh, one_line, venv_works, wait_for
from playbook_runner import REPO, PlaybookRun

# Holds the dpkg frontend lock the way apt does (a POSIX record lock) until stdin closes.
HOLDER = """
import fcntl, sys
f = open('/var/lib/dpkg/lock-frontend', 'w')
fcntl.lockf(f, fcntl.LOCK_EX)
print('locked', flush=True)
sys.stdin.read()
"""
EXTRA_PACKAGE = "tree"
# The toolchain role's bounds file (DPkg::Lock::Timeout), which a run with another bound rewrites.
BOUNDS = "/etc/apt/apt.conf.d/80mlstack-bounds"
# Its copy while the test runs: outside apt.conf.d, where apt would read it (or print that it ignores it).
BOUNDS_KEPT = "/root/80mlstack-bounds.before-test"


class LockHolder:
    def __init__(self, vmid: int) -> None:
        self.proc = subprocess.Popen(
            ["lxc-attach", "-n", str(vmid), "--clear-env", "--", "/usr/bin/python3", "-c", HOLDER],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "locked"
        self.released_at: float | None = None

    def release(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            self.proc.wait(30)
        self.released_at = self.released_at or time.time()


def other_apt(vmid: int) -> str:
    """apt, dpkg or unattended-upgrades running in the container (a timer's run), one per line."""
    return ct_sh(vmid, "pgrep -a -x 'apt|apt-get|dpkg|unattended-upgr|aptitude' || true").stdout.strip()


@pytest.fixture
def apt_lock(shared_ct: dict[str, Any]) -> Iterator[Any]:
    """hold() -> a LockHolder, once no other apt or dpkg runs in the shared CT (the holder must be the only
    one the run meets). The CT is left as found: the extra package removed, and apt's bounds file (a failed
    step would leave the short bound in it) put back."""
    vmid = int(shared_ct["vmid"])
    ct_sh(vmid, f"apt-get remove -y -q {EXTRA_PACKAGE} >/dev/null 2>&1 || true")
    ct_sh(vmid, f"cp -p {BOUNDS} {BOUNDS_KEPT}")
    holders: list[LockHolder] = []

    def hold() -> LockHolder:
        assert wait_for(lambda: not other_apt(vmid), 300), f"apt busy in CT {vmid}: {other_apt(vmid)}"
        holders.append(LockHolder(vmid))
        return holders[-1]

    yield hold
    for h in holders:
        h.release()
    ct_sh(vmid, f"apt-get remove -y -q {EXTRA_PACKAGE} >/dev/null 2>&1 || true")
    ct_sh(vmid, f"mv {BOUNDS_KEPT} {BOUNDS}")


def packages_plus_one() -> list[str]:
    defaults = yaml.safe_load((REPO / "roles" / "toolchain" / "defaults" / "main.yml").read_text())
    return [*defaults["toolchain_packages"], EXTRA_PACKAGE]


def installed(vmid: int) -> bool:
    return ct_sh(vmid, f"dpkg-query -W -f '${{Status}}' {EXTRA_PACKAGE}").stdout == "install ok installed"


@pytest.mark.slow
def test_apt_lock_held_by_another_process(runner: Any, shared_ct: dict[str, Any], apt_lock: Any) -> None:
    vmid = int(shared_ct["vmid"])
    extra = {"toolchain_packages": packages_plus_one(), "doctor_tier": "quick"}

    # 1. Held past the bound (10 s here): the run gives up once, says which lock and who holds it.
    holder = apt_lock()
    t0 = time.monotonic()
    held = runner("provision.yml", [shared_ct], toolchain_apt_lock_timeout=10, **extra)
    text = one_line(held.output)
    # apt's own result and the role's message, whole, for any assertion below that fails (the run's end
    # where it never got to apt).
    apt_task = held.output.find("TASK [toolchain : Install the compiler toolchain")
    apt_said = held.output[max(apt_task, 0) :][-8000:]
    assert held.rc != 0, apt_said
    assert "waited 10 s for the dpkg lock and gave up" in text, apt_said
    assert "Could not get lock /var/lib/dpkg/lock-frontend" in text, apt_said
    assert "python3" in text, "the holder is named: " + apt_said
    retried = [ln for ln in held.output.splitlines() if "RETRYING" in ln and "compiler toolchain" in ln]
    assert retried == [], "a lock timeout is the bound: not retried"
    assert time.monotonic() - t0 < 600
    # State: nothing half-installed, the venv working.
    assert not installed(vmid)
    assert ct_sh(vmid, "dpkg --audit").stdout.strip() == ""
    assert venv_works(vmid)
    holder.release()

    # 2. Held when the rerun starts, let go while apt waits: apt takes it and the run completes.
    holder = apt_lock()
    results: dict[str, Any] = {}
    thread = threading.Thread(
        target=lambda: results.update(run=runner("provision.yml", [shared_ct], **extra))
    )
    thread.start()
    try:

        def apt_running() -> bool:
            return ct_sh(vmid, "pgrep -f 'apt-get.*[i]nstall' >/dev/null").returncode == 0

        wait_for(lambda: apt_running() or not thread.is_alive(), 600)
        assert apt_running(), "apt never started: " + results.get("run", PlaybookRun(0, "")).output[-3000:]
        time.sleep(5)
        assert apt_running(), "apt did not wait for the lock"
        holder.release()
    finally:
        thread.join(900)
    again = results["run"]
    assert again.rc == 0, again.output[-4000:]
    assert installed(vmid)
    installed_at = float(ct_sh(vmid, f"stat -c %Y /var/lib/dpkg/info/{EXTRA_PACKAGE}.list").stdout)
    assert holder.released_at is not None and installed_at >= int(holder.released_at) - 1
    assert "waited" not in one_line(again.output)
