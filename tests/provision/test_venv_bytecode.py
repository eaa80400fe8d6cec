"""A second venv of the same lock on a node starts with the first one's compiled bytecode (CT 150, shared
with test_doctor_defaults.py): mlstack-build-venv, as provisioning installed it in the container, builds
another venv of the default profile beside the active one, in the same shared store, and links the .pyc
files whose source is the very same file. Importing torch and transformers there then compiles nothing,
and the modules are those of the new venv. The doctor of that venv finds the model config the first venv's
doctor built (its stamp, in a Triton cache both name) and does not build it again; a file of its own in
place of a shared one makes it build. A venv of another lock under the same name shares nothing."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
from playbook_runner import DEFAULT_CT_VMID, DEFAULT_PROFILE, PlaybookRun

VMID = DEFAULT_CT_VMID
BUILDER = "/opt/mlstack/bin/mlstack-build-venv"
ACTIVE = "/opt/mlstack/venv"
# Beside ct150's own venvs folder in the node's shared store: nothing of it is CT 150's state.
ASIDE = "/var/cache/mlstack/uv/venvs/ct150-bytecode-test"
IMPORTS = "import torch, transformers.models.qwen3_5, sys; print(torch.__file__)"
PYCS = "find {venv}/lib -name '*.pyc' | wc -l"

pytestmark = pytest.mark.testbed


def sh(script: str, timeout: float = 600) -> Any:
    from tbhelpers import attach

    return attach(VMID, f"export HOME=/root PATH=/usr/local/bin:/usr/bin:/bin; {script}", timeout=timeout)


def count(venv: str) -> int:
    r = sh(PYCS.format(venv=venv))
    assert r.returncode == 0, r.stderr
    return int(r.stdout.strip())


@pytest.fixture(scope="module")
def profile(default_ct: tuple[PlaybookRun, Any]) -> Iterator[dict[str, str]]:
    """The active venv's profile folder and the venv it is (the first provision ran the doctor's full tier
    there, so torch and transformers are compiled), with the aside folder removed before and after."""
    first, _ = default_ct
    assert first.rc == 0, first.output[-3000:]
    active = sh(f"readlink -f {ACTIVE}").stdout.strip()
    name = active.rsplit("/", 1)[1]
    assert name.startswith(DEFAULT_PROFILE), active
    sh(f"rm -rf {ASIDE}")
    yield {"dir": f"/opt/mlstack/profiles/{name}", "name": name, "active": active}
    sh(f"rm -rf {ASIDE} /tmp/other-lock")


def test_a_second_venv_of_the_same_lock_imports_without_compiling(profile: dict[str, str]) -> None:
    assert count(profile["active"]) > 1000  # torch and transformers, compiled by the doctor's first run
    venv = f"{ASIDE}/{profile['name']}"
    built = sh(f"mkdir -p {ASIDE} && {BUILDER} {profile['dir']} {venv}")
    assert built.returncode == 0, (built.stdout, built.stderr)
    # The builder's last line, which the play shows: its time, uv's summary and the bytecode it linked.
    last = built.stdout.strip().splitlines()[-1]
    said = re.search(r"; bytecode: (\d+) compiled modules linked from (.+)\)$", last)
    assert last.startswith(f"mlstack-build-venv: built {venv} in ") and said, built.stdout
    assert int(said.group(1)) > 1000, last
    # Venvs of this lock in the node's store: CT 150's, or another container's on the node.
    store = "/var/cache/mlstack/uv/venvs"
    assert all(re.fullmatch(rf"{store}/[^/]+/{profile['name']}", v) for v in said.group(2).split(", ")), last
    links = sh(f"stat -c %h {venv}/lib/python3.11/site-packages/torch/__pycache__/__init__.cpython-311.pyc")
    assert int(links.stdout) >= 2, links  # one file with the venv it came from, not a copy

    before = count(venv)
    imported = sh(f"cd /root && {venv}/bin/python -c '{IMPORTS}'")
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == f"{venv}/lib/python3.11/site-packages/torch/__init__.py"
    assert count(venv) == before  # nothing compiled on the first import


def model_config(venv: str, root: str) -> dict[str, Any]:
    """The model_config probe of `venv`'s doctor, typed as a user would (the container's login environment),
    with Triton caches under `root`: <root>/<venv name>, as provisioning lays out the node's caches."""
    run = sh(
        f". /etc/profile.d/mlstack.sh; cd /root && "
        f"{venv}/bin/mlstack-doctor --no-gpu --only model_config --triton-cache-root {root} --json --quiet"
    )
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-2000:])
    return next(p for p in json.loads(run.stdout)["probes"] if p["name"] == "model_config")


def test_a_second_venv_of_the_lock_finds_the_model_config_built_by_the_first(profile: dict[str, str]) -> None:
    venv = f"{ASIDE}/{profile['name']}"
    built = sh(f"mkdir -p {ASIDE} && {BUILDER} {profile['dir']} {venv}")  # already complete after the above
    assert built.returncode == 0, (built.stdout, built.stderr)
    # The doctor in the second venv, from the wheel provisioning copied into the container.
    doctor = sh(
        f"UV_CACHE_DIR=/tmp/uv-doctor-test /opt/mlstack/tools/bin/uv pip install -q --offline --no-deps "
        f"--python {venv}/bin/python /opt/mlstack/dist/mlstack_doctor-*.whl"
    )
    assert doctor.returncode == 0, doctor.stderr
    # Caches of the test's own, not the node's that other containers of this stack use meanwhile; both
    # venvs have the same name, so the same cache.
    root = "/tmp/config-stamp-test"
    sh(f"rm -rf {root}")
    first = model_config(ACTIVE, root)
    assert first["status"] == "pass" and "built_at" not in first["evidence"], first
    assert first["evidence"]["config_stamp"].startswith(f"{root}/{profile['name']}/mlstack-config/"), first

    second = model_config(venv, root)
    assert second["status"] == "pass", second
    assert second["summary"].endswith("with these very files: not built again)"), second["summary"]
    assert second["evidence"]["config_stamp"] == first["evidence"]["config_stamp"]
    assert second["evidence"]["built_on"] == sh("hostname").stdout.strip()
    assert second["evidence"]["params"] == first["evidence"]["params"]

    # One file of the second venv replaced by a copy of the same bytes: no longer the first venv's file.
    init = f"{venv}/lib/python3.11/site-packages/transformers/__init__.py"
    sh(f"cp -p {init} {init}.copy && mv {init}.copy {init}")
    third = model_config(venv, root)
    assert third["status"] == "pass" and "built_at" not in third["evidence"], third
    assert third["evidence"]["config_stamp"] != first["evidence"]["config_stamp"]
    sh(f"rm -rf {root} /tmp/uv-doctor-test")


def test_a_venv_of_another_lock_shares_nothing(profile: dict[str, str]) -> None:
    # The same project with one more line in its lock: another lock hash, under the same venv name.
    other = "/tmp/other-lock"
    prepared = sh(
        f"rm -rf {other} && cp -r {profile['dir']} {other} && echo '# another lock' >> {other}/uv.lock"
    )
    assert prepared.returncode == 0, prepared.stderr
    venv = f"{ASIDE}/{profile['name']}"
    sh(f"rm -rf {venv}")
    built = sh(f"mkdir -p {ASIDE} && {BUILDER} {other} {venv}")
    assert built.returncode == 0, (built.stdout, built.stderr)
    assert "mlstack-build-venv: built" in built.stdout and "bytecode:" not in built.stdout, built.stdout
    torch_pyc = f"{venv}/lib/python3.11/site-packages/torch/__pycache__/__init__.cpython-311.pyc"
    assert sh(f"test -e {torch_pyc}").returncode == 1  # torch not compiled: nothing came from CT 150's venv
