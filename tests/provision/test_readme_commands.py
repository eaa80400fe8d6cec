"""README.md's commands, typed as written in a shell that did nothing else (`env -i`: no PATH that
make sets, no activated venv, no ANSIBLE_CONFIG), against the testbed: the real-cluster block with the
testbed's inventory in place of inventory/mycluster, and the installed-collection block in a fresh
project folder. They provision the README's own container (vmid 100 of inventory/testbed); one this
test created is destroyed again."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
README_VMID = 100
# A shell as a new terminal has it, and nothing else.
CLEAN_ENV = {
    "HOME": "/root",
    "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG": "C.UTF-8",
    "TERM": "dumb",
}


def readme_blocks() -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", (REPO / "README.md").read_text(), flags=re.S | re.M)


def block_with(needle: str) -> str:
    found = [b for b in readme_blocks() if needle in b]
    assert len(found) == 1, f"README.md should have one sh block with {needle!r}, has {len(found)}"
    return found[0]


def clean_shell(script: str, cwd: Path, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    """`script` run by bash -e in `cwd`, from an empty environment; the commands are echoed (-x)."""
    return subprocess.run(
        ["env", "-i", *(f"{k}={v}" for k, v in CLEAN_ENV.items()), "bash", "-exc", script],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def recap(output: str, host: str) -> dict[str, int]:
    """The PLAY RECAP counters of one host (the last recap in the output)."""
    lines = [ln for ln in output.splitlines() if re.match(rf"{re.escape(host)}\s+: ok=", ln)]
    assert lines, f"no recap for {host}:\n{output[-3000:]}"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", lines[-1])}


@pytest.fixture
def readme_ct(api: Any, testbed: Any) -> Any:
    """The README's container: kept if it was there before, else destroyed at the end."""
    from tbhelpers import ct_exists, remove_ct

    existed = ct_exists(api, testbed.node, README_VMID)
    yield README_VMID
    if not existed:
        remove_ct(testbed.proxmox(), testbed, README_VMID)


@pytest.mark.slow
def test_readme_commands_run_as_written(readme_ct: int, tmp_path: Path) -> None:
    # The real-cluster block, pointed at the testbed (the one inventory without a vault).
    cluster = block_with("-i inventory/mycluster provision.yml")
    cluster = cluster.replace("inventory/mycluster", "inventory/testbed").replace(" --ask-vault-pass", "")
    run = clean_shell(cluster, REPO)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert recap(run.stdout, f"testbed-ct{readme_ct}")["failed"] == 0
    assert "| testbed | testbed-ct100 | 100 |" in run.stdout, "the fleet report lists the README's container"

    # The installed-collection block: a fresh project folder holding only an inventory.
    project, dist = tmp_path / "pve-ops", tmp_path / "dist"
    shutil.copytree(REPO / "inventory" / "testbed", project / "inventory")
    installed = block_with("mlstack.pve.provision")
    installed = installed.replace("~/pve-ops", str(project)).replace("/tmp/mlstack-dist", str(dist))
    installed = installed.replace(" --ask-vault-pass", "")
    run = clean_shell(installed, REPO)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]

    # The tarball holds what users run, and no testbed, tests or nested copies of the tree.
    tarball = next(dist.glob("mlstack-pve-*.tar.gz"))
    names = subprocess.run(["tar", "tzf", str(tarball)], capture_output=True, text=True, check=True).stdout
    files = [n for n in names.splitlines() if not n.endswith("/")]
    assert "playbooks/provision.yml" in files and "verify/pyproject.toml" in files
    assert not [n for n in files if n.startswith(("testbed/", "tests/", ".", "molecule/", "build/"))]
    assert not [n for n in files if "/.ansible/" in n or "__pycache__" in n]
    assert len(files) < 250, f"{len(files)} files in the tarball"
    # The installed copy ran (its roles, its doctor source), and wrote its reports in the project.
    assert "collections/ansible_collections/mlstack/pve/roles/" in run.stdout
    assert (project / "reports" / "fleet.json").is_file()
    # Run after the checkout's run on the same container: nothing left to change.
    assert recap(run.stdout, f"testbed-ct{readme_ct}")["changed"] == 0, run.stdout[-4000:]
