"""Helpers for the testbed tests: real commands against the real parts, bounded in time."""

import contextlib
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
# The venv the tests run in: its ansible-playbook, and the collections path that `make venv` links.
VENV_BIN = Path(sys.executable).parent
if str(REPO / "testbed") not in sys.path:
    sys.path.insert(0, str(REPO / "testbed"))

from mlstack_testbed import client  # noqa: E402
from mlstack_testbed.lxc import realct  # noqa: E402


def wait_ok(api: Any, testbed: client.Testbed, upid: str, timeout: float = 180) -> dict[str, Any]:
    status = client.wait_task(api, testbed.node, upid, timeout)
    assert status["exitstatus"] == "OK", client.task_log(api, testbed.node, upid)
    return status


def wait_takes_halt(vmid: int, timeout: float = 120) -> None:
    """Wait until the container's init takes a halt signal (SIGPWR caught or blocked, as systemd does once
    it runs). Sent before that, the kernel drops it for a namespace's init and a shutdown times out, in PVE
    too: a shutdown right after a start is the test's race, not the shutdown's fault."""
    bit = 1 << (signal.SIGPWR - 1)
    deadline = time.monotonic() + timeout
    while True:
        pid = realct.state(vmid)[1]
        masks = {}
        if pid is not None:
            with contextlib.suppress(OSError):
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    key, _, value = line.partition(":")
                    if key in ("SigBlk", "SigCgt"):
                        masks[key] = int(value, 16)
        if any(mask & bit for mask in masks.values()):  # SigBlk: systemd reads it from a signalfd
            return
        assert time.monotonic() < deadline, f"CT {vmid}'s init (pid {pid}) took no SIGPWR in {timeout} s"
        time.sleep(0.1)


def remove_ct(api: Any, testbed: client.Testbed, vmid: int) -> None:
    """Destroy a test container through the API (stopping it first); the real side as a fallback."""
    from proxmoxer.core import ResourceException

    ct = api.nodes(testbed.node).lxc(vmid)
    try:
        if ct.status.current.get()["status"] == "running":
            client.wait_task(api, testbed.node, ct.status.stop.post(), 60)
        client.wait_task(api, testbed.node, ct.delete(purge=1), 120)
    except ResourceException as e:
        if "does not exist" not in str(e.content):
            raise
    if realct.exists(vmid) or realct.ct_dir(vmid).exists():
        realct.destroy(vmid)


def run(argv: list[str], timeout: float = 60, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False, **kwargs)


def api_args(testbed: client.Testbed) -> dict[str, Any]:
    """community.proxmox's connection options for the testbed's API: its password login, TLS checked."""
    return {
        "api_host": testbed.api_host,
        "api_port": testbed.api_port,
        "api_user": testbed.api_user,
        "api_password": testbed.api_password,
        "validate_certs": True,
    }


# An inventory of localhost alone, its modules run by this venv's python (proxmoxer is there).
_LOCALHOST = {"ansible_connection": "local", "ansible_python_interpreter": sys.executable}
LOCAL_INVENTORY = json.dumps({"all": {"hosts": {"localhost": _LOCALHOST}}})


def playbook(
    env: dict[str, str], tmp: Path, inventory: str, plays: str, timeout: float = 300
) -> dict[str, Any]:
    """ansible-playbook with the json callback (env: the ansible_env fixture); its parsed output."""
    (tmp / "hosts.yml").write_text(inventory)
    (tmp / "play.yml").write_text(plays)
    r = run(
        [str(VENV_BIN / "ansible-playbook"), "-i", str(tmp / "hosts.yml"), str(tmp / "play.yml")],
        timeout=timeout,
        env=env,
    )
    assert r.stdout.startswith("{"), r.stdout + r.stderr
    out: dict[str, Any] = json.loads(r.stdout)
    return out


def results(out: dict[str, Any], host: str) -> list[dict[str, Any]]:
    """Each task's result for `host`, in order."""
    return [t["hosts"][host] for play in out["plays"] for t in play["tasks"] if host in t["hosts"]]


def attach(vmid: int, script: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """A shell command inside the real container, straight through lxc-attach (not through the testbed)."""
    return run(["lxc-attach", "-n", str(vmid), "--clear-env", "--", "/bin/sh", "-c", script], timeout=timeout)


def ssh(
    testbed: client.Testbed,
    command: str,
    stdin: str | None = None,
    timeout: float = 60,
    known_hosts: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """A command on the testbed's sshd, verifying its host key against its pinned one (or `known_hosts`)."""
    argv = [
        "ssh",
        "-o",
        "BatchMode=yes",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        f"UserKnownHostsFile={known_hosts or testbed.ssh_known_hosts_file}",
        "-o",
        "GlobalKnownHostsFile=/dev/null",
        "-i",
        testbed.ssh_key_file,
        "-p",
        str(testbed.ssh_port),
        f"{testbed.ssh_user}@{testbed.ssh_host}",
        command,
    ]
    return run(argv, timeout=timeout, input=stdin)


def ct_exists(api: Any, node: str, vmid: int) -> bool:
    """Whether the API knows container `vmid`."""
    from proxmoxer.core import ResourceException

    try:
        api.nodes(node).lxc(vmid).status.current.get()
        return True
    except ResourceException:
        return False


class OwnApi:
    """A second API server of this checkout's code (node.backend.TestbedPve) on a loopback port of its own,
    with its own state, access file and token secrets under `state_dir`: what it answers is what the shared
    server will answer once restarted, and nothing of the shared server's state is touched. It shares the
    machine's LXC: a create that passed every check would make a real container, so its callers keep each
    create refused."""

    HOST = "127.0.0.1"

    def __init__(self, state_dir: Path) -> None:
        import asyncio
        import threading

        from fakepve.certs import make_cert
        from mlstack_testbed.node.backend import TestbedPve

        self.password = "own-api-password"
        self.cafile, keyfile, _ = make_cert(str(state_dir), hosts=(self.HOST,))
        self.pve = TestbedPve(
            password=self.password,
            host=self.HOST,
            port=0,
            state_file=state_dir / "api-state.json",
            access_file=state_dir / "access.json",
            tokens_dir=state_dir / "tokens",
        )
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="own-api", daemon=True)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.pve.start(self.cafile, keyfile), self._loop).result(30)

    @property
    def port(self) -> int:
        return int(self.pve.port)

    def stop(self) -> None:
        import asyncio

        try:
            asyncio.run_coroutine_threadsafe(self.pve.stop(), self._loop).result(30)
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(30)

    def url(self, path: str) -> str:
        return f"https://{self.HOST}:{self.port}/api2/json{path}"

    def proxmox(self, token_id: str | None = None, secret: str = "") -> Any:
        """proxmoxer, as community.proxmox drives it: root@pam's password, or the token `token_id`."""
        from proxmoxer import ProxmoxAPI

        if token_id is None:
            return ProxmoxAPI(
                self.HOST, port=self.port, user="root@pam", password=self.password, verify_ssl=self.cafile
            )
        user, _, name = token_id.partition("!")
        return ProxmoxAPI(
            self.HOST, port=self.port, user=user, token_name=name, token_value=secret, verify_ssl=self.cafile
        )
