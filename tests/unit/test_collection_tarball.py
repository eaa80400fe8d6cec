"""The collection tarball holds only the product. It is built from a copy of this checkout in which a
user has done what README.md says (copied the example inventory, created a vault file next to it) and
left files of their own around; none of it may be packed, and the installed collection must resolve
(its playbooks parse against its example inventory, no link inside it dangles)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
# Top-level entries the tarball may hold (galaxy.yml's manifest names them one by one).
PRODUCT = {
    "CHANGELOG.md",
    "README.md",
    "changelogs",
    "FILES.json",
    "MANIFEST.json",
    "docs",
    "inventory",
    "meta",
    "monitoring",
    "playbooks",
    "plugins",
    "profiles",
    "roles",
    "verify",
}
VAULT_TEXT = "$ANSIBLE_VAULT;1.1;AES256\n6162636465660a\n"
# What a user leaves in their checkout: their inventory with its vault file (0600, as ansible-vault
# writes it), a vault file by another name, and stray files of their own.
USER_FILES = {
    "inventory/mycluster/hosts.yml": "all: {}\n",
    "inventory/mycluster/group_vars/pve_hosts.yml": "mlstack_pve_api_host: 10.0.0.11\n",
    "inventory/mycluster/group_vars/pve_hosts/vault.yml": VAULT_TEXT,
    "roles/doctor/vars/vault.yml": VAULT_TEXT,
    "profiles/site-secrets.vault": VAULT_TEXT,
    "notes.txt": "cluster root password is in the safe\n",
    "playbooks/.env": "PVE_TOKEN=secret\n",
}
SKIP = shutil.ignore_patterns(
    ".git", ".venv*", "build", "reports", "__pycache__", ".pytest_cache", ".ruff_cache"
)


def run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=300, check=False, env={**os.environ, **env}
    )
    assert r.returncode == 0, f"{argv}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[tarfile.TarInfo]]:
    checkout = tmp_path_factory.mktemp("checkout") / "pve"
    shutil.copytree(REPO, checkout, ignore=SKIP, symlinks=True)
    for rel, text in USER_FILES.items():
        path = checkout / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        path.chmod(0o600)
    dist = tmp_path_factory.mktemp("dist")
    run([str(BIN / "ansible-galaxy"), "collection", "build", "--output-path", str(dist)], checkout)
    tarball = next(dist.glob("mlstack-pve-*.tar.gz"))
    with tarfile.open(tarball) as tar:
        members = tar.getmembers()
    return tarball, members


def test_only_the_product_is_packed(built: tuple[Path, list[tarfile.TarInfo]]) -> None:
    _, members = built
    names = [m.name for m in members]
    assert set(n.split("/")[0] for n in names) <= PRODUCT, sorted(
        set(n.split("/")[0] for n in names) - PRODUCT
    )
    inventories = {n.split("/")[1] for n in names if n.startswith("inventory/") and n.count("/") >= 1}
    assert inventories == {"example"}, inventories
    for rel in USER_FILES:
        assert rel not in names, f"{rel} is packed"
    assert not [
        n for n in names if n.startswith(("testbed/", "tests/", "molecule/", "build/", "verify/tests"))
    ]
    assert not [n for n in names if "requirements-controller" in n]
    assert not [n for n in names if "/." in f"/{n}" or "__pycache__" in n or n.endswith(".pyc")]
    # What users run is there.
    for rel in ("playbooks/provision.yml", "verify/pyproject.toml", "roles/doctor/tasks/main.yml"):
        assert rel in names, rel


def test_no_vault_content_anywhere(built: tuple[Path, list[tarfile.TarInfo]]) -> None:
    tarball, members = built
    with tarfile.open(tarball) as tar:
        for m in members:
            if m.isfile():
                head = tar.extractfile(m).read(16)  # type: ignore[union-attr]
                assert not head.startswith(b"$ANSIBLE_VAULT"), f"{m.name} is a vault file"
    assert not [m.name for m in members if m.issym() or m.islnk()], "links in the tarball"


def test_installed_collection_resolves(built: tuple[Path, list[tarfile.TarInfo]], tmp_path: Path) -> None:
    tarball, _ = built
    project = tmp_path / "pve-ops"
    project.mkdir()
    run(
        [str(BIN / "ansible-galaxy"), "collection", "install", "--force", str(tarball), "-p", "collections"],
        project,
    )
    installed = project / "collections" / "ansible_collections" / "mlstack" / "pve"
    dangling = [str(p) for p in installed.rglob("*") if p.is_symlink() and not p.exists()]
    assert not dangling, dangling
    inventory = installed / "inventory" / "example"
    # The project's own ansible.cfg, as a user's would be: nothing of this checkout's.
    (project / "ansible.cfg").write_text("[defaults]\n")
    env = {
        "ANSIBLE_COLLECTIONS_PATH": str(project / "collections"),
        "ANSIBLE_CONFIG": str(project / "ansible.cfg"),
    }
    listed = run([str(BIN / "ansible-inventory"), "-i", str(inventory), "--list"], project, **env)
    assert '"pve_hosts"' in listed.stdout
    for play in ("provision", "verify", "upgrade", "rollback", "destroy"):
        run(
            [str(BIN / "ansible-playbook"), "-i", str(inventory), f"mlstack.pve.{play}", "--syntax-check"],
            project,
            **env,
        )


def test_shipped_inventories_are_self_contained() -> None:
    # A copied inventory folder must work where it lands: no link out of it.
    for path in (REPO / "inventory").rglob("*"):
        assert not path.is_symlink(), f"{path.relative_to(REPO)} is a link: a copy of its folder breaks"
    # The testbed cluster connects as the one-node testbed does: its group vars are the same file.
    one = REPO / "inventory" / "testbed" / "group_vars" / "pve_hosts.yml"
    cluster = REPO / "inventory" / "testbed-cluster" / "group_vars" / "pve_hosts.yml"
    assert cluster.read_text() == one.read_text(), (
        "inventory/testbed-cluster's group vars differ from testbed's"
    )
