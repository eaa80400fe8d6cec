"""Helpers of the fault suite: cut links, inject faults at exact points, look into containers.

Everything acts on this suite's own runs and containers (vmids 160-189): a link is cut in a forwarder
only this run uses, a second PVE node is a second sshd, and machine-wide faults (a /dev node) are put
back in a finally."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from playbook_runner import callbacks_with

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
PY = str(REPO / ".venv" / "bin" / "python")
CALLBACKS = HERE / "callback_plugins"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def environ(**env: str) -> Iterator[None]:
    """os.environ with `env` set, for the runner's subprocess (make_runner copies os.environ)."""
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def fault_env(task: str, cmd: str, mark: Path, when: str = "ok", on_retry: str = "") -> dict[str, str]:
    """Environment that makes tests/faults/callback_plugins/mlstack_fault.py run `cmd` at `task` (and
    `on_retry` when that task is first retried)."""
    return {
        "ANSIBLE_CALLBACK_PLUGINS": str(CALLBACKS),
        "ANSIBLE_CALLBACKS_ENABLED": callbacks_with("mlstack_fault"),
        "MLSTACK_FAULT_TASK": task,
        "MLSTACK_FAULT_WHEN": when,
        "MLSTACK_FAULT_CMD": cmd,
        "MLSTACK_FAULT_RETRY_CMD": on_retry,
        "MLSTACK_FAULT_MARK": str(mark),
    }


class Link:
    """A TCP forwarder 127.0.0.1:port -> 127.0.0.1:target in its own process: cut() kills it (every
    connection through it dies at once, new ones are refused), restore() brings it back on the same port."""

    def __init__(self, target: int) -> None:
        self.target = target
        self.port = free_port()
        self.proc: subprocess.Popen[str] | None = None
        self.pidfile = Path(f"/tmp/mlstack-faults-link-{self.port}.pid")
        self.restore()

    @property
    def argv(self) -> list[str]:
        return [PY, str(HERE / "tcpproxy.py"), str(self.port), str(self.target)]

    def restore(self) -> None:
        self.cut()
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        assert self.proc.stdout.readline().strip() == "ready"
        self.pidfile.write_text(f"{self.proc.pid}\n")

    def cut_command(self) -> str:
        """A shell command that cuts the link (for the fault callback, which runs in ansible-playbook)."""
        return f"kill -9 $(cat {self.pidfile})"

    def restore_command(self) -> str:
        """A shell command that brings the link back in the background (for the fault callback); close()
        ends the forwarder it starts."""
        return f"{shlex.join(self.argv)} >/dev/null 2>&1 & echo $! > {self.pidfile}"

    def cut(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def close(self) -> None:
        self.cut()
        # A forwarder restore_command() started is not this object's child: found by its pidfile.
        with contextlib.suppress(OSError, ValueError):
            pid = int(self.pidfile.read_text())
            if str(HERE / "tcpproxy.py") in Path(f"/proc/{pid}/cmdline").read_text():
                os.kill(pid, signal.SIGKILL)
        self.pidfile.unlink(missing_ok=True)


def run(argv: list[str], timeout: float = 60, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kw)


def ct_sh(vmid: int, script: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """A shell command inside the real container, straight through lxc-attach (not through the testbed)."""
    return run(["lxc-attach", "-n", str(vmid), "--clear-env", "--", "/bin/sh", "-c", script], timeout=timeout)


def venv_works(vmid: int, venv: str = "/opt/mlstack/venv") -> bool:
    """The venv imports torch, triton and fla, and is marked complete."""
    r = ct_sh(
        vmid,
        f"test -f {venv}/.mlstack-complete && {venv}/bin/python -c 'import torch, triton, fla'",
        timeout=180,
    )
    return r.returncode == 0


def ct_ls(vmid: int, folder: str) -> list[str]:
    r = ct_sh(vmid, f"ls -1A {folder} 2>/dev/null || true")
    return sorted(r.stdout.split())


def wait_for(predicate: Any, timeout: float, step: float = 0.5) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return False


def one_line(text: str) -> str:
    """Playbook output with whitespace folded, for message assertions across wrapped lines."""
    return " ".join(text.split())


class GpulessNode:
    """A second PVE node with no NVIDIA device nodes: an sshd (the testbed's config, keys and pct) in its
    own mount namespace whose /dev is a copy of the machine's without nvidia*. The preflight runs against it
    unchanged, over real SSH, and sees what a CPU-only PVE node shows."""

    def __init__(self, state_dir: Path, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.known_hosts = workdir / "known_hosts"
        pub = (state_dir / "ssh" / "ssh_host_ed25519_key.pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n")
        self.pidfile = workdir / "sshd.pid"
        devdir = workdir / "dev"
        sbin = state_dir / "sbin"
        config = state_dir / "ssh" / "sshd_config"
        inner = " && ".join(
            [
                "mount --make-rprivate /",
                f"mkdir -p {devdir}",
                f"mount -t tmpfs -o mode=0755 mlstack-faults-dev {devdir}",
                # Every /dev entry but the NVIDIA ones: nodes copied, folders (pts, shm, mqueue) bound.
                "for e in /dev/* /dev/.[!.]*; do n=${e##*/}; "
                "case $n in nvidia*|'.[!.]*') continue;; esac; "
                f'if [ -d "$e" ] && [ ! -L "$e" ]; then mkdir -p {devdir}/$n && '
                f'mount --rbind "$e" {devdir}/$n; else cp -a "$e" {devdir}/; fi; done',
                f"mount --rbind {devdir} /dev",
                f"mount -t overlay mlstack-faults-sbin -o ro,lowerdir={sbin}:/usr/sbin /usr/sbin",
                f"exec /usr/sbin/sshd -D -e -f {config} -o Port={self.port} -o PidFile={self.pidfile}",
            ]
        )
        self.log = (workdir / "sshd.log").open("w")
        self.proc = subprocess.Popen(
            ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", inner],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"},
        )
        ok = wait_for(self._answers, 20)
        assert ok, (workdir / "sshd.log").read_text()

    def _answers(self) -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1) as s:
            return s.recv(8).startswith(b"SSH-")
        return False

    def extra_vars(self) -> dict[str, Any]:
        """Extra vars that point the inventory's node at this sshd, host key checked."""
        checked = f"-o UserKnownHostsFile={self.known_hosts} -o StrictHostKeyChecking=yes"
        return {"ansible_port": self.port, "ansible_ssh_common_args": checked}

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def fleet_row(vmid: int) -> dict[str, Any] | None:
    fleet = json.loads((REPO / "reports" / "fleet.json").read_text())
    return next((r for r in fleet["containers"] if str(r["vmid"]) == str(vmid)), None)


def dev_node(path: str) -> tuple[int, int, int]:
    """(mode, major, minor) of a device node, to put it back exactly."""
    st = os.stat(path)
    return st.st_mode, os.major(st.st_rdev), os.minor(st.st_rdev)
