"""An apt lock held by another process inside the container, on the shared CT. apt is made to need
the lock by asking for one more small package (tree) than the toolchain has.

First the lock is held past a short bound: the run gives up after that bound (no retries of a lock
timeout) and names the lock and its holder. Then the rerun starts with the lock still held and the
holder lets go while apt waits: apt takes the lock and the run completes."""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from faultlib import ct_sh, one_line, venv_works, wait_for
from playbook_runner import REPO, PlaybookRun

# Holds the dpkg frontend lock the way apt does (a POSIX record lock) until stdin closes, and prints
# "tried" each time another process opens the lock file meanwhile (inotify's IN_OPEN): apt opens it for
# every try of the lock, so the holder sees apt meet the lock and try again.
HOLDER = """
import ctypes, fcntl, os, struct, sys, threading
path = sys.argv[1]
f = open(path, 'w')
fcntl.lockf(f, fcntl.LOCK_EX)
libc = ctypes.CDLL(None, use_errno=True)
watch = libc.inotify_init()
assert watch >= 0 and libc.inotify_add_watch(watch, path.encode(), 0x20) >= 0, ctypes.get_errno()
print('locked', flush=True)
def tries():
    while True:
        buf, at = os.read(watch, 4096), 0
        while at < len(buf):
            at += 16 + struct.unpack_from('iIII', buf, at)[3]
            print('tried', flush=True)
threading.Thread(target=tries, daemon=True).start()
sys.stdin.read()
"""
DPKG_LOCK = "/var/lib/dpkg/lock-frontend"
EXTRA_PACKAGE = "tree"
# The toolchain role's bounds file (DPkg::Lock::Timeout), which a run with another bound rewrites.
BOUNDS = "/etc/apt/apt.conf.d/80mlstack-bounds"
# Its copy while the test runs: outside apt.conf.d, where apt would read it (or print that it ignores it).
BOUNDS_KEPT = "/root/80mlstack-bounds.before-test"


class LockHolder:
    def __init__(self, vmid: int, argv: tuple[str, ...] = (), lock: str = DPKG_LOCK) -> None:
        inside = argv or ("lxc-attach", "-n", str(vmid), "--clear-env", "--", "/usr/bin/python3")
        # Unbuffered bytes: select() on the pipe sees every line the holder printed.
        argv = [*inside, "-c", HOLDER, lock]
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert self.proc.stdout is not None
        self.out = self.proc.stdout.fileno()
        self.said = b""
        deadline = time.monotonic() + 30
        while b"\n" not in self.said and self.read(deadline - time.monotonic()):
            pass
        assert self.said.startswith(b"locked\n"), self.said
        self.released_at: float | None = None

    def read(self, timeout: float) -> bool:
        """What the holder printed within `timeout` seconds, added to `said`; False when nothing came."""
        if not select.select([self.out], [], [], max(timeout, 0))[0]:
            return False
        chunk = os.read(self.out, 4096)
        self.said += chunk
        return bool(chunk)

    def tried_again(self, times: int, timeout: float) -> bool:
        """Whether others try the lock `times` more times (tries already printed not counted) within
        `timeout` seconds."""
        while self.read(0):
            pass
        want = self.said.count(b"tried\n") + times
        deadline = time.monotonic() + timeout
        while self.said.count(b"tried\n") < want:
            if not self.read(deadline - time.monotonic()):
                return False
        return True

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
        # apt meets the held lock and tries it again, twice (DPkg::Lock::Timeout's wait), and still runs.
        assert holder.tried_again(2, 60) and apt_running(), "apt did not wait for the lock"
        holder.release()
    finally:
        thread.join(900)
    again = results["run"]
    assert again.rc == 0, again.output[-4000:]
    assert installed(vmid)
    installed_at = float(ct_sh(vmid, f"stat -c %Y /var/lib/dpkg/info/{EXTRA_PACKAGE}.list").stdout)
    assert holder.released_at is not None and installed_at >= int(holder.released_at) - 1
    assert "waited" not in one_line(again.output)


@pytest.mark.parametrize(("timeout", "waits"), [(20, True), (0, False)], ids=["lock-timeout", "no-wait"])
def test_the_holder_sees_apt_try_the_held_lock_again(tmp_path: Path, timeout: int, waits: bool) -> None:
    """This machine's apt-get against a lock the holder holds (an admin folder of its own, dpkg replaced by
    false: nothing is installed whatever happens): with a lock timeout it tries again and again, which the
    holder sees; without one it tries once and gives up."""
    admin = tmp_path / "dpkg"
    admin.mkdir()
    shutil.copy("/var/lib/dpkg/status", admin / "status")
    holder = LockHolder(0, argv=(sys.executable,), lock=str(admin / "lock-frontend"))
    options = {
        "Dir::State::status": admin / "status",
        "Dir::Cache::archives": tmp_path,
        "Dir::Bin::dpkg": "/bin/false",
        "DPkg::Lock::Timeout": timeout,
    }
    argv = ["apt-get", "-qq", *(f"-o{k}={v}" for k, v in options.items()), "install", "-y", EXTRA_PACKAGE]
    apt = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if waits:
            assert holder.tried_again(2, 60), holder.said
        else:
            said = apt.communicate(timeout=60)[0]
            while holder.read(0.5):
                pass
            assert apt.returncode != 0 and holder.said.count(b"tried\n") == 1, (holder.said, said)
    finally:
        apt.kill()
        apt.wait(30)
        holder.release()
