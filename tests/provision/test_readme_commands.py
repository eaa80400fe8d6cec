"""The commands of README.md and docs/*.md, typed as written in a clean login shell (`env -i HOME=/root
bash -l`: no PATH that make sets, no activated venv, no ANSIBLE_CONFIG), against the testbed. Every `sh`
block is either run here (RUN: the test that runs it) or skipped with the reason it cannot run here
(SKIP), so a new block is run or consciously left out: a block in neither fails the test.

They provision the README's own container (CT 100 of inventory/testbed): the real-cluster block with
the testbed's inventory in place of inventory/mycluster, the installed-collection block in a fresh
project folder, the in-container blocks inside CT 100, and destroy.yml last when this test created it."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
README_VMID = 100
README_CT = f"testbed-ct{README_VMID}"
# The documents whose sh blocks a user types.
DOCS = ("README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md")))

# (document, a line the block holds) -> the test below that runs it.
RUN = {
    (
        "README.md",
        "cp -r inventory/example inventory/mycluster",
    ): "test_the_inventory_block_makes_an_inventory",
    (
        "README.md",
        "ansible-playbook -i inventory/mycluster provision.yml",
    ): "test_readme_commands_run_as_written",
    ("docs/real-cluster.md", "mlstack.pve.provision"): "test_readme_commands_run_as_written",
    ("docs/day-two.md", "ansible-playbook verify.yml -e mlstack_verify_tier=fast"): "test_the_verify_block",
    ("docs/doctor.md", "mlstack-doctor --no-gpu --json"): "test_the_blocks_typed_inside_the_container",
    ("docs/monitoring.md", "systemctl list-timers"): "test_the_blocks_typed_inside_the_container",
    ("docs/testbed.md", "testbed/testbed status --json"): "test_the_status_and_test_blocks",
    ("docs/tests.md", "tests/lanes.py --list"): "test_the_status_and_test_blocks",
    ("docs/tests.md", "pytest -q tests/unit/test_lanes.py"): "test_the_status_and_test_blocks",
    ("docs/day-two.md", "destroy.yml -e mlstack_destroy_confirm=true"): "test_the_destroy_block",
}
# (document, a line the block holds) -> why it is not run here.
SKIP = {
    ("README.md", "make provision"): (
        "`make test` runs this file (it would run itself); `make provision` starts the testbed, which a "
        "step beside others may not do (MLSTACK_TESTBED_SHARED), then runs the provision.yml of "
        "inventory/testbed that the real-cluster block runs here"
    ),
    ("docs/real-cluster.md", "pveum role add"): (
        "pveum exists on a real PVE node only; tests/testbed/test_token_privileges.py holds these grants to "
        "the testbed token's privileges and tests/provision/test_api_token.py provisions with such a token"
    ),
    ("docs/day-two.md", "upgrade.yml -e mlstack_upgrade_profile="): (
        "rebuilds CT 100's stack for another profile and back (minutes, gigabytes of wheels); "
        "tests/provision/test_upgrade.py runs upgrade.yml and rollback.yml on a container of its own"
    ),
    ("docs/day-two.md", "mlstack_upgrade_snapshot=true"): (
        "rebuilds CT 100's stack, then restores a snapshot (minutes, gigabytes of wheels); "
        "tests/provision/test_snapshots.py runs both on a container of its own, on a snapshot-capable storage"
    ),
    ("docs/doctor.md", "mlstack-doctor --tier full"): (
        "for a container with GPUs: the testbed's have none, so there is nothing to warm or to race"
    ),
    ("docs/testbed.md", "make testbed"): (
        "changes or stops the shared testbed (GPU model, driver version, down, purge); the node-state step's "
        "tests run `up` with these options, and tests/testbed/test_purge_venvs.py what `down --purge` removes"
    ),
    ("docs/testbed.md", "testbed/testbed reboot testbed3"): (
        "reboots a node of the shared testbed (its containers stopped, the machine's uvm nodes removed); "
        "tests/provision/test_reboot.py runs the plain and the --module-missing reboot on CT 300-301"
    ),
    ("docs/testbed.md", "testbed/testbed up --nodes 3"): (
        "provisions and destroys inventory/testbed-cluster's six containers (vmids 301-306, about 8 minutes "
        "on 2 cores); tests/provision/test_fleet.py runs provision.yml and destroy.yml across the three nodes"
    ),
    ("docs/tests.md", "make test "): "the command that runs this test",
    ("docs/tests.md", "make test-other-stack"): (
        "27 minutes; `make test` runs its lifecycle, API token and bad-input files as the other stack's "
        "steps (core221-* on Debian 12, core219-* on Debian 13)"
    ),
    ("docs/tests.md", "pytest -m gpu verify/tests"): "for a GPU machine: here every test it selects skips",
    ("docs/awx.md", "ansible-builder build"): (
        "needs a container engine (podman or docker), which this machine lacks; "
        "tests/unit/test_execution_environment.py runs `ansible-builder create` and checks its context"
    ),
}


def sh_blocks(doc: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", (REPO / doc).read_text(), flags=re.S | re.M)


def block(doc: str, needle: str) -> str:
    found = [b for b in sh_blocks(doc) if needle in b]
    assert len(found) == 1, f"{doc} should have one sh block with {needle!r}, has {len(found)}"
    return found[0]


def clean_shell(
    script: str, cwd: Path, timeout: float = 1800, env: dict[str, str] | None = None, tty: bool = False
) -> subprocess.CompletedProcess[str]:
    """`script` as typed in a new login shell of root (`env -i HOME=/root bash -l`) in `cwd`, stopping at
    the first command that fails, each command echoed (-x). `env`: what the person at the keyboard
    brings (an editor); `tty`: on a terminal (ansible-vault opens its editor only there)."""
    path = cwd / f".readme-block-{abs(hash(script))}.sh"
    path.write_text("set -ex\n" + script)
    try:
        argv = [
            "env",
            "-i",
            "HOME=/root",
            *(f"{k}={v}" for k, v in (env or {}).items()),
            "bash",
            "-l",
            str(path),
        ]
        if tty:
            argv = ["script", "-qec", " ".join(argv), "/dev/null"]
        return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    finally:
        path.unlink()


def in_container(script: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """`script` typed in a login shell inside the README's container (what `pct enter` gives on a node)."""
    argv = ["lxc-attach", "-n", str(README_VMID), "--clear-env", "--", "env", "-i", "HOME=/root"]
    argv += ["bash", "-l", "-c", "set -ex\n" + script]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)


def recap(output: str, host: str) -> dict[str, int]:
    """The PLAY RECAP counters of one host (the last recap in the output)."""
    lines = [ln for ln in output.splitlines() if re.match(rf"{re.escape(host)}\s+: ok=", ln)]
    assert lines, f"no recap for {host}:\n{output[-3000:]}"
    return {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", lines[-1])}


def changed_tasks(output: str, host: str) -> list[str]:
    """The tasks that reported `changed` for `host`, by name."""
    found, task = [], ""
    for line in output.splitlines():
        if line.startswith("TASK ["):
            task = line.split("[", 1)[1].rsplit("]", 1)[0]
        elif line.startswith(f"changed: [{host}"):
            found.append(task)
    return found


def as_testbed(script: str) -> str:
    """A real-cluster block pointed at the testbed: its inventory (the one without a vault) for yours."""
    return script.replace("inventory/mycluster", "inventory/testbed").replace(" --ask-vault-pass", "")


def test_every_block_is_run_or_skipped_with_its_reason() -> None:
    known = {**RUN, **SKIP}
    for doc in DOCS:
        for b in sh_blocks(doc):
            keys = [key for key in known if key[0] == doc and key[1] in b]
            assert len(keys) == 1, f"{doc}: this block is neither run nor skipped here (or both):\n{b}"
    for doc, needle in known:
        block(doc, needle)  # each entry names one block that is still there
    assert not set(RUN) & set(SKIP)


@pytest.fixture(scope="module")
def readme_ct(testbed: Any) -> Iterator[dict[str, Any]]:
    """The README's container: kept if it was there before this file's tests, else destroyed at the end
    (by the destroy block's test, or here if that did not run)."""
    from tbhelpers import ct_exists, remove_ct

    state = {"existed": ct_exists(testbed.proxmox(), testbed.node, README_VMID), "testbed": testbed}
    yield state
    if not state["existed"] and ct_exists(testbed.proxmox(), testbed.node, README_VMID):
        remove_ct(testbed.proxmox(), testbed, README_VMID)


@pytest.mark.slow
def test_readme_commands_run_as_written(readme_ct: dict[str, Any], tmp_path: Path) -> None:
    # The real-cluster block, pointed at the testbed.
    run = clean_shell(as_testbed(block("README.md", "-i inventory/mycluster provision.yml")), REPO)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert recap(run.stdout, README_CT)["failed"] == 0
    assert f"| testbed | {README_CT} | 100 |" in run.stdout, "the fleet report lists the README's container"

    # The installed-collection block: a fresh project folder holding only an inventory.
    project, dist = tmp_path / "pve-ops", tmp_path / "dist"
    shutil.copytree(REPO / "inventory" / "testbed", project / "inventory")
    installed = block("docs/real-cluster.md", "mlstack.pve.provision")
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
    # Only the checkout's own tracked files (and the two that galaxy writes): nothing built, untracked or
    # copied in. A nested copy of the tree would double the count.
    tracked = set(
        subprocess.run(
            ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.split()
    )
    assert not [n for n in files if n not in tracked and n not in ("MANIFEST.json", "FILES.json")]
    assert len(files) < 300, f"{len(files)} files in the tarball"
    # The installed copy ran (its roles, its doctor source), and wrote its reports in the project.
    assert "collections/ansible_collections/mlstack/pve/roles/" in run.stdout
    assert (project / "reports" / "fleet.json").is_file()
    # Run after the checkout's run on the same container: nothing left to change.
    assert recap(run.stdout, README_CT)["changed"] == 0, changed_tasks(run.stdout, README_CT)


@pytest.mark.slow
def test_the_verify_block(readme_ct: dict[str, Any]) -> None:
    run = clean_shell(
        block("docs/day-two.md", "ansible-playbook verify.yml -e mlstack_verify_tier=fast"), REPO
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    counts = recap(run.stdout, README_CT)
    assert counts["changed"] == 0 and counts["failed"] == 0, f"verify.yml changes nothing: {counts}"
    assert f"| testbed | {README_CT} | 100 |" in run.stdout


@pytest.mark.slow
def test_the_blocks_typed_inside_the_container(readme_ct: dict[str, Any]) -> None:
    run = in_container(block("docs/doctor.md", "mlstack-doctor --no-gpu --json"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(run.stdout)
    assert report["summary"]["ok"] is True, report["summary"]

    run = in_container(block("docs/monitoring.md", "systemctl list-timers"))
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "mlstack-doctor-fast.timer" in run.stdout and "mlstack-doctor-quick.timer" in run.stdout
    metrics = run.stdout.split("cat /var/lib/mlstack/metrics/doctor.prom", 1)[-1]
    assert re.search(r'^mlstack_doctor_\w+\{[^}]*tier="quick"', run.stdout, re.M), metrics[-3000:]


@pytest.mark.slow
def test_the_status_and_test_blocks(readme_ct: dict[str, Any]) -> None:
    run = clean_shell(block("docs/testbed.md", "testbed/testbed status --json"), REPO)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert f"CT {README_VMID} " in run.stdout, "status lists the README's container"

    run = clean_shell(block("docs/tests.md", "tests/lanes.py --list"), REPO)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert re.search(r"^provision \[", run.stdout, re.M), run.stdout[-3000:]

    run = clean_shell(block("docs/tests.md", "pytest -q tests/unit/test_lanes.py"), REPO, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]
    assert re.search(r"^\d+ passed", run.stdout, re.M), run.stdout[-3000:]


@pytest.mark.slow
def test_the_inventory_block_makes_an_inventory(tmp_path: Path) -> None:
    """The quick start's first block in a checkout of its own (the controller venv linked in, the example
    inventory copied), with an editor that leaves the inventory as it is and writes the secret into the
    vault (ansible-vault hands it a temporary file), and a vault password file: the person at the
    keyboard. The copied inventory then resolves, its vault included."""
    checkout = tmp_path / "checkout"
    shutil.copytree(REPO / "inventory" / "example", checkout / "inventory" / "example")
    (checkout / ".venv").symlink_to(REPO / ".venv")
    editor, password = tmp_path / "editor", tmp_path / "vault-password"
    editor.write_text(
        '#!/bin/sh\ncase "$1" in */hosts.yml) ;; *) echo "vault_pve_api_token_secret: s3cret" > "$1";; esac\n'
    )
    editor.chmod(0o755)
    password.write_text("readme\n")
    keyboard = {"EDITOR": str(editor), "ANSIBLE_VAULT_PASSWORD_FILE": str(password)}
    run = clean_shell(block("README.md", "cp -r inventory/example"), checkout, env=keyboard, tty=True)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-2000:]

    mine = checkout / "inventory" / "mycluster"
    assert (mine / "group_vars" / "all" / "vault.yml").read_text().startswith("$ANSIBLE_VAULT;1.1;")
    shown = subprocess.run(
        [str(REPO / ".venv" / "bin" / "ansible-inventory"), "-i", str(mine), "--host", "gpu-node-1"],
        cwd=tmp_path,
        env={"HOME": "/root", "PATH": "/usr/bin:/bin", "ANSIBLE_VAULT_PASSWORD_FILE": str(password)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    # The vault's secret and the node settings beside it both reach the node.
    host = json.loads(shown.stdout)
    found = {
        k: host.get(k) for k in ("vault_pve_api_token_secret", "mlstack_pve_api_token_id", "ansible_user")
    }
    assert found == {
        "vault_pve_api_token_secret": "s3cret",
        "mlstack_pve_api_token_id": "root@pam!mlstack",
        "ansible_user": "root",
    }


@pytest.mark.slow
def test_the_destroy_block(readme_ct: dict[str, Any]) -> None:
    """Last: destroy.yml removes the README's container and its venvs from the node's uv store."""
    if readme_ct["existed"]:
        pytest.skip(f"CT {README_VMID} was there before these tests: kept")
    from mlstack_testbed.__main__ import node_venvs_dir
    from tbhelpers import ct_exists

    testbed = readme_ct["testbed"]
    venvs = node_venvs_dir(README_VMID)
    assert venvs.is_dir(), "the README's container built no venv in the node's store"
    run = clean_shell(
        as_testbed(block("docs/day-two.md", "destroy.yml -e mlstack_destroy_confirm=true")), REPO
    )
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    assert not ct_exists(testbed.proxmox(), testbed.node, README_VMID)
    assert not venvs.exists(), f"{venvs} left in the node's uv store"
