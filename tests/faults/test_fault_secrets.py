"""Secrets stay out of every log. Runs last in the suite (conftest orders it), so the grep sees every
playbook run of the fault suite: its output and the log file Ansible wrote (ANSIBLE_LOG_PATH).

Every run of the suite reads the API password from an ansible-vault file (conftest's vault fixture),
the shared CT's first provision at -vvv. Here, destroy.yml also runs with the password only in the
environment (PROXMOX_PASSWORD, the community.proxmox fallback), none in the inventory. Then a grep of
all the suite's logs and of the fleet and doctor reports for the API password, the vault password and
the SSH private key finds nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from playbook_runner import REPO


def test_api_password_from_the_environment_only(
    runner: Any, shared_ct: dict[str, Any], testbed: Any, tmp_path: Path
) -> None:
    host_vars = tmp_path / "inventory" / "host_vars" / "testbed"
    host_vars.mkdir(parents=True)
    (host_vars / "main.yml").write_text('mlstack_pve_api_password: ""\n')
    env = {"PROXMOX_PASSWORD": testbed.api_password, "ANSIBLE_VERBOSITY": "3"}
    result = runner(
        "destroy.yml",
        [shared_ct],
        env=env,
        workdir=tmp_path,
        vaulted=False,
        mlstack_destroy_confirm=True,
        mlstack_destroy_vmids=[],
    )
    assert result.rc == 0, result.output[-4000:]
    assert "TASK [gpu_container : Read the guests on the node]" in result.output


def test_no_secret_in_any_log_or_report(fault_logs: Path, testbed: Any, vault: Any) -> None:
    key_lines = Path(testbed.ssh_key_file).read_text().splitlines()
    key_body = "".join(ln for ln in key_lines if ln and not ln.startswith("-----"))
    used = {
        "API password": testbed.api_password,
        "vault password": vault.password,
        "SSH private key": key_body[20:60],
    }
    assert all(len(v) >= 8 for v in used.values()), "a secret too short to grep for"
    files = sorted(p for p in fault_logs.iterdir() if p.is_file())
    verbose = [p for p in files if p.suffix == ".out" and " ESTABLISH " in p.read_text()]
    assert len(files) >= 4 and verbose, "no (verbose) playbook output to grep: run the whole fault suite"
    files += [REPO / "reports" / "fleet.json", REPO / "reports" / "fleet.md"]
    files += sorted((REPO / "reports" / "doctor").glob("*.json"))
    found = [
        f"{name} in {path}"
        for name, value in used.items()
        for path in files
        if path.is_file() and value in path.read_text(errors="replace")
    ]
    assert found == [], found
