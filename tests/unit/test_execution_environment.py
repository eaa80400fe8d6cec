"""The execution environment AWX runs the playbooks in: `ansible-builder create` writes its build context
from execution-environment.yml and the collection's meta/execution-environment.yml, and what that context
installs is what the controller stack it is built on runs (tools/controller_stack.py's
EXECUTION_ENVIRONMENT: its lock, the collections its `ansible` bundles). No image is built: there is no
container engine here.

The collections' versions are read from that stack's installed `ansible`, so the file runs on that stack's
Ansible: .venv's where it holds it, else the second controller's (`make test`'s <stack>-controller step)."""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import controller_stack  # noqa: E402

EE_STACK = controller_stack.by_name(controller_stack.EXECUTION_ENVIRONMENT)
BIN = Path(sys.executable).parent
GALAXY = str(BIN / "ansible-galaxy")
# What the plugins and roles need on the controller (proxmoxer and requests: community.proxmox's API
# modules; paramiko: proxmox_pct_remote; uv: the doctor's wheel).
CONTROLLER_PACKAGES = {"proxmoxer", "requests", "paramiko", "uv"}


@dataclass(frozen=True)
class Context:
    path: Path
    definition: dict
    built_from: Path


def run(argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=300, check=False, env={**os.environ, **env}
    )
    assert r.returncode == 0, f"{argv}:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


def pins(lines: list[str]) -> dict[str, str]:
    """name -> version of each `name==version` line (comments, blank lines and markers left out)."""
    found = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        (spec,) = req.specifier  # one exact pin per line
        assert spec.operator == "==", f"{line!r} is not pinned"
        found[canonicalize_name(req.name)] = spec.version
    return found


def locked() -> dict[str, str]:
    return pins((REPO / EE_STACK.lock).read_text().splitlines())


if importlib.metadata.version("ansible-core") != locked()["ansible-core"]:
    pytest.skip(
        f"the execution environment is {EE_STACK.name}'s (ansible-core {locked()['ansible-core']}): this "
        f"Python's is {importlib.metadata.version('ansible-core')}; `make test`'s {EE_STACK.name}-controller "
        "step runs this file",
        allow_module_level=True,
    )


def bundled_collection(fqcn: str) -> Path:
    """Where the locked `ansible` package holds a collection."""
    namespace, name = fqcn.split(".")
    return Path(sysconfig.get_paths()["purelib"]) / "ansible_collections" / namespace / name


def bundled_collection_info(fqcn: str) -> dict:
    """A collection's collection_info as the locked `ansible` package bundles it (its MANIFEST.json)."""
    return json.loads((bundled_collection(fqcn) / "MANIFEST.json").read_text())["collection_info"]


def bundled_collection_version(fqcn: str) -> str:
    return bundled_collection_info(fqcn)["version"]


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Context:
    # The definition beside a fresh tarball, as its header comment says to run it, outside the checkout.
    src = tmp_path_factory.mktemp("ee-src")
    shutil.copy(REPO / "execution-environment.yml", src)
    shutil.copytree(REPO / "meta", src / "meta")
    run([GALAXY, "collection", "build", "--output-path", str(src / "build" / "collection")], REPO)
    ctx = tmp_path_factory.mktemp("ee") / "context"
    run(
        [
            str(BIN / "ansible-builder"), "create", "--file", str(src / "execution-environment.yml"),
            "--context", str(ctx), "--output-filename", "Containerfile",
        ],
        src,
    )  # fmt: skip
    definition = yaml.safe_load((src / "execution-environment.yml").read_text())
    return Context(ctx, definition, src)


def test_context_lists_its_files(context: Context) -> None:
    listing = sorted(str(p.relative_to(context.path)) for p in context.path.rglob("*") if p.is_file())
    for rel in (
        "Containerfile",
        "_build/requirements.txt",
        "_build/bindep.txt",
        "_build/requirements.yml",
        "_build/collections/mlstack-pve-0.1.0.tar.gz",
    ):
        assert rel in listing, listing


def test_python_requirements_are_the_lock(context: Context) -> None:
    wanted = pins((context.path / "_build" / "requirements.txt").read_text().splitlines())
    assert set(wanted) == CONTROLLER_PACKAGES
    lock = locked()
    assert {name: lock[name] for name in wanted} == wanted, "meta/ee-requirements.txt differs from the lock"


def test_ansible_core_is_the_lock(context: Context) -> None:
    containerfile = (context.path / "Containerfile").read_text()
    refs = re.search(r'^ARG ANSIBLE_INSTALL_REFS="([^"]*)"', containerfile, re.M)
    assert refs, containerfile
    installed = pins(refs.group(1).split())
    assert installed["ansible-core"] == locked()["ansible-core"]
    assert "ansible-runner" in installed, "AWX runs jobs through ansible-runner"


def test_collections_are_the_tested_ones(context: Context) -> None:
    galaxy = yaml.safe_load((context.path / "_build" / "requirements.yml").read_text())["collections"]
    by_name = {c["name"]: c for c in galaxy}
    meta = yaml.safe_load((REPO / "galaxy.yml").read_text())
    for fqcn, constraint in meta["dependencies"].items():
        version = by_name[fqcn]["version"]
        assert version == bundled_collection_version(fqcn), f"{fqcn}: not the locked ansible's version"
        assert Version(version) in SpecifierSet(constraint), f"{fqcn} {version}: galaxy.yml says {constraint}"
    pinned = {c["name"]: c["version"] for c in galaxy if c.get("type") != "file"}
    for fqcn, version in pinned.items():
        assert version == bundled_collection_version(fqcn), f"{fqcn}: not the locked ansible's version"
        # What a pinned collection needs is pinned too (else Galaxy's newest would come).
        for dependency in bundled_collection_info(fqcn)["dependencies"]:
            assert dependency in pinned, f"{dependency} (a dependency of {fqcn}) is not pinned"
    (own,) = [c for c in galaxy if c.get("type") == "file"]
    # Installed in the galaxy stage from /build (the context's _build), and it is this version.
    tarball = context.path / "_build" / own["name"]
    assert tarball.is_file(), f"{own['name']} is not in the context"
    assert tarball.name == f"{meta['namespace']}-{meta['name']}-{meta['version']}.tar.gz"


@pytest.fixture(scope="module")
def galaxy_stage(context: Context, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The collections path the image's galaxy stage writes: its `ansible-galaxy collection install` run in
    the context's _build (as the Containerfile runs it in /build), offline, with the locked ansible's
    community collections already there in place of Galaxy's."""
    root = tmp_path_factory.mktemp("galaxy-stage")
    build = root / "build"
    shutil.copytree(context.path / "_build", build)
    collections = root / "collections"
    for wanted in yaml.safe_load((build / "requirements.yml").read_text())["collections"]:
        if wanted.get("type") != "file":
            namespace, name = wanted["name"].split(".")
            (collections / "ansible_collections" / namespace).mkdir(parents=True, exist_ok=True)
            (collections / "ansible_collections" / namespace / name).symlink_to(
                bundled_collection(wanted["name"]), target_is_directory=True
            )
    (root / "ansible.cfg").write_text("[defaults]\n")
    env = {
        "ANSIBLE_CONFIG": str(root / "ansible.cfg"),
        "ANSIBLE_COLLECTIONS_PATH": str(collections),
        "ANSIBLE_COLLECTIONS_SCAN_SYS_PATH": "false",
    }
    argv = [GALAXY, "collection", "install", "--offline", "-r", "requirements.yml", "-p", str(collections)]
    out = run(argv, build, **env).stdout
    # The pinned community versions are the ones there: nothing else would come from Galaxy.
    for wanted in yaml.safe_load((build / "requirements.yml").read_text())["collections"]:
        if wanted.get("type") != "file":
            assert f"'{wanted['name']}:{wanted['version']}' is already installed" in out, out
    assert "mlstack.pve:0.1.0 was installed successfully" in out, out
    return collections


def test_collection_declares_its_own_dependencies(context: Context, galaxy_stage: Path) -> None:
    # What the builder stage's introspection finds in the installed collection (an EE that installs it
    # from another source than this definition gets the same packages).
    installed = galaxy_stage / "ansible_collections" / "mlstack" / "pve"
    for rel in ("meta/execution-environment.yml", "meta/ee-requirements.txt", "meta/ee-bindep.txt"):
        assert (installed / rel).is_file(), f"{rel} is not in the collection's tarball"
    out = run(
        [str(BIN / "ansible-builder"), "introspect", "--sanitize", str(galaxy_stage)], galaxy_stage
    ).stdout
    found = yaml.safe_load(out[out.index("---") :])
    ours = [line for line in found["python"] if line.endswith("# from collection mlstack.pve")]
    assert pins(ours) == {name: locked()[name] for name in CONTROLLER_PACKAGES}
    system = [line for line in found["system"] if line.endswith("# from collection mlstack.pve")]
    assert {line.split("#")[0].strip() for line in system} == {
        "openssh-client [platform:dpkg]",
        "openssh-clients [platform:rpm]",
    }


def test_system_packages_resolve_on_a_debian_controller(context: Context) -> None:
    listed = run([str(BIN / "bindep"), "--file", "_build/bindep.txt", "-l", "newline"], context.path).stdout
    assert listed.split() == ["openssh-client"]


def test_python_runs_the_stack(context: Context) -> None:
    interpreter = context.definition["dependencies"]["python_interpreter"]
    found = re.fullmatch(r"/usr/bin/python(\d+)\.(\d+)", interpreter["python_path"])
    assert found, interpreter
    version = (int(found.group(1)), int(found.group(2)))
    assert controller_stack.runs_on(EE_STACK, version), (
        f"{EE_STACK.ansible} needs Python >= {EE_STACK.python}"
    )
    assert interpreter["package_system"] == f"python{version[0]}.{version[1]}"
    containerfile = (context.path / "Containerfile").read_text()
    assert f'ARG PYCMD="{interpreter["python_path"]}"' in containerfile, containerfile


def test_uv_lands_where_the_doctor_role_looks(context: Context, tmp_path: Path) -> None:
    # The image's step, run here: a Python without uv beside it, uv installed elsewhere on PATH.
    steps = context.definition["additional_build_steps"]["append_final"]
    (step,) = [s for s in steps if "uv" in s]
    python = Path(context.definition["dependencies"]["python_interpreter"]["python_path"]).name
    python_dir = tmp_path / "usr" / "bin"
    python_dir.mkdir(parents=True)
    (python_dir / python).symlink_to(sys.executable)
    uv_dir = tmp_path / "usr" / "local" / "bin"
    uv_dir.mkdir(parents=True)
    (uv_dir / "uv").symlink_to(BIN / "uv")
    command = step.removeprefix("RUN ")
    env = {"PYCMD": str(python_dir / python), "PATH": f"{uv_dir}:/usr/bin:/bin"}
    for _ in range(2):  # a second run (a rebuilt layer) finds it in place
        out = run(["bash", "-c", command], tmp_path, **env).stdout
        assert out.startswith(f"uv {locked()['uv']}"), out
    # roles/doctor/defaults/main.yml: doctor_controller_uv is "{{ ansible_playbook_python | dirname }}/uv".
    assert (python_dir / "uv").resolve() == (BIN / "uv").resolve()
