"""Fixtures of the fault suite: faults injected for real on the testbed, each followed by the state it
left and a rerun. Reuses tests/provision/playbook_runner.py's runner (imported, not copied) and the
testbed fixture of tests/conftest.py. Containers of this suite use vmids 160-189; CT 160 is provisioned
once and shared by the faults that allow it. MLSTACK_FAULTS_VMIDS (FIRST-LAST) gives a session part of
that range, for two sessions at once (make test's two fault steps): its first vmid is its shared CT.

Every playbook run's output, and the log file Ansible writes (ANSIBLE_LOG_PATH), is kept under one
folder per session, which test_fault_secrets.py greps for the secrets the suite used."""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for _path in (HERE, REPO / "tests" / "provision", REPO / "tests" / "testbed"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

# The provisioning suite's runner, imported (the testbed fixture comes from tests/conftest.py).
from faultlib import ct_sh  # noqa: E402
from playbook_runner import PlaybookRun, container, make_runner  # noqa: E402

__all__ = ["REPO", "PlaybookRun", "container"]

SUITE_VMIDS = range(160, 190)


def _vmids() -> range:
    first, _, last = os.environ.get("MLSTACK_FAULTS_VMIDS", "160-189").partition("-")
    mine = range(int(first), int(last) + 1)
    assert mine and set(mine) <= set(SUITE_VMIDS), f"MLSTACK_FAULTS_VMIDS={first}-{last}: within 160-189"
    return mine


VMIDS = _vmids()
SHARED_VMID = VMIDS[0]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark this directory's tests `testbed`, skip them when not root, and run the secrets grep last so
    it sees every other run's logs."""
    skip = pytest.mark.skip(reason="the fault suite needs root (real LXC containers, sshd, device nodes)")
    mine = [i for i in items if HERE in Path(str(i.path)).parents]
    for item in mine:
        item.add_marker(pytest.mark.testbed)
        if os.geteuid() != 0:
            item.add_marker(skip)
    last = [i for i in mine if Path(str(i.path)).name == "test_fault_secrets.py"]
    items[:] = [i for i in items if i not in last] + last


@pytest.fixture
def api(testbed: Any) -> Any:
    """A fresh API login per test (a ticket does not outlive an API server restart)."""
    return testbed.proxmox()


@pytest.fixture(scope="session")
def fault_logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where every playbook run of the suite leaves its output and its Ansible log file."""
    return tmp_path_factory.mktemp("fault-logs")


_counter = itertools.count(1)


@dataclass(frozen=True)
class Vault:
    """The API password as a real deployment keeps it: in an ansible-vault file, whose password is in a
    file of its own. Every run of the suite reads the password from it (host_vars of the node)."""

    password_file: Path
    vault_file: Path

    @property
    def password(self) -> str:
        return self.password_file.read_text().strip()

    def install(self, inventory: Path) -> None:
        host_vars = inventory / "host_vars" / "testbed"
        host_vars.mkdir(parents=True, exist_ok=True)
        shutil.copy(self.vault_file, host_vars / "vault.yml")
        (host_vars / "main.yml").write_text('mlstack_pve_api_password: "{{ vault_pve_api_password }}"\n')


@pytest.fixture(scope="session")
def vault(tmp_path_factory: pytest.TempPathFactory, testbed: Any) -> Vault:
    folder = tmp_path_factory.mktemp("vault")
    password_file = folder / "vault-pass"
    password_file.write_text(secrets.token_urlsafe(24) + "\n")
    password_file.chmod(0o600)
    vault_file = folder / "vault.yml"
    argv = [str(REPO / ".venv" / "bin" / "ansible-vault"), "encrypt", "--output", str(vault_file), "-"]
    r = subprocess.run(
        [*argv, "--vault-password-file", str(password_file)],
        input=yaml.safe_dump({"vault_pve_api_password": testbed.api_password}),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert testbed.api_password not in vault_file.read_text()
    return Vault(password_file, vault_file)


@pytest.fixture(scope="session")
def runner(
    tmp_path_factory: pytest.TempPathFactory, testbed: Any, fault_logs: Path, vault: Vault
) -> Callable[..., Any]:
    """run(playbook, containers, env=None, timeout=..., workdir=None, vaulted=True, **extra_vars) ->
    PlaybookRun: make_runner in a fresh folder per run (so runs can go in parallel), the API password
    from the vault (unless vaulted=False), the fault env, and an Ansible log file kept for the grep."""

    def run(
        playbook: str,
        containers: list[dict[str, Any]],
        env: dict[str, str] | None = None,
        timeout: int = 900,
        workdir: Path | None = None,
        vaulted: bool = True,
        **extra: Any,
    ) -> Any:
        n = next(_counter)
        folder = workdir or tmp_path_factory.mktemp(f"run{n}")
        log = fault_logs / f"{n:02d}-{playbook}.ansible.log"
        run_env = {"ANSIBLE_LOG_PATH": str(log)}
        if vaulted:
            vault.install(folder / "inventory")
            run_env["ANSIBLE_VAULT_PASSWORD_FILE"] = str(vault.password_file)
        run_env.update(env or {})
        result = make_runner(folder, env=run_env)(playbook, containers, timeout=timeout, **extra)
        (fault_logs / f"{n:02d}-{playbook}.out").write_text(result.output)
        return result

    return run


@pytest.fixture(scope="session", autouse=True)
def _no_leftovers(testbed: Any) -> None:
    """This session's containers (161-189 but the shared one) left by an interrupted earlier session are
    removed first: each fault starts from a known state (autouse here applies to this directory's tests
    only)."""
    from tbhelpers import remove_ct

    session_api = testbed.proxmox()
    for vmid in VMIDS:
        if vmid != SHARED_VMID:
            remove_ct(session_api, testbed, vmid)


@pytest.fixture(scope="session")
def shared_ct(runner: Callable[..., Any], testbed: Any) -> Iterator[dict[str, Any]]:
    """The shared CT (160), provisioned once by provision.yml (from scratch: a leftover is destroyed first;
    at -vvv, so the secrets grep sees every API call's arguments) and destroyed at the end of the session.
    Faults that allow it run against it. MLSTACK_FAULTS_REUSE=1 keeps it between sessions (development).
    MLSTACK_FAULTS_HANDOFF hands it from one session to the next (make test's node-state step, which runs
    the device-node fault, to its faults step): "keep" provisions it from scratch and keeps it, "take"
    starts from the complete one kept (or from scratch without one) and destroys it at the end."""
    from tbhelpers import remove_ct

    entry = container(SHARED_VMID, hostname=f"fault-{SHARED_VMID}")
    handoff = os.environ.get("MLSTACK_FAULTS_HANDOFF", "")
    assert handoff in ("", "keep", "take"), f"MLSTACK_FAULTS_HANDOFF={handoff!r}: keep or take"
    reuse = os.environ.get("MLSTACK_FAULTS_REUSE") == "1"
    kept = reuse or handoff == "take"
    if not kept:
        remove_ct(testbed.proxmox(), testbed, SHARED_VMID)
    if not (kept and ct_sh(SHARED_VMID, "test -f /opt/mlstack/venv/.mlstack-complete").returncode == 0):
        # A first provision at -vvv beside make test's other steps: on 2 cores it has taken 15 minutes.
        first = runner(
            "provision.yml", [entry], env={"ANSIBLE_VERBOSITY": "3"}, timeout=1800, doctor_tier="quick"
        )
        assert first.rc == 0, first.output[-4000:]
    yield entry
    # Venvs the faults built aside live in the node's shared store, not in the container: remove them.
    ct_sh(SHARED_VMID, f"rm -rf /var/cache/mlstack/uv/venvs/ct{SHARED_VMID}-faults*")
    if not (reuse or handoff == "keep"):
        runner("destroy.yml", [entry], mlstack_destroy_confirm=True)


@pytest.fixture
def fresh_vmid(testbed: Any) -> Iterator[Callable[[int], int]]:
    """fresh_vmid(n): vmid n (one of this session's, not the shared CT) removed now and at the end of the
    test."""
    from tbhelpers import remove_ct

    taken: list[int] = []

    def take(vmid: int) -> int:
        assert vmid in VMIDS and vmid != SHARED_VMID, f"fault vmids here: {VMIDS}, not CT {SHARED_VMID}"
        remove_ct(testbed.proxmox(), testbed, vmid)
        taken.append(vmid)
        return vmid

    yield take
    for vmid in taken:
        remove_ct(testbed.proxmox(), testbed, vmid)
