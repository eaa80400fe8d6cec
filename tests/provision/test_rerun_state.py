"""A rerun of provision.yml on one real testbed container (CT 150, shared: conftest.py's default_ct)
after something inside was changed by hand: each role reads its state in one round trip and takes its
fast path only when that state matches. What differs is named in the role's own line, and only the task
that fixes it changes; a venv changed since its build (a package installed over the lock, or one
removed) is never taken for matching, and is built again from the lock."""

from __future__ import annotations

from typing import Any

import pytest
from playbook_runner import DEFAULT_CT_VMID, PlaybookRun, container

VMID = DEFAULT_CT_VMID
CT = [container(VMID)]
VENV = "/opt/mlstack/venv"
# uv pip as a user would run it over the venv (the shared cache, the index for what it lacks).
UV_ENV = "UV_CACHE_DIR=/var/cache/mlstack/uv/cache UV_SYSTEM_CERTS=1"
UV = UV_ENV + " /opt/mlstack/tools/bin/uv pip {} --python " + VENV + "/bin/python"


@pytest.fixture(scope="module")
def run_module(default_ct: tuple[PlaybookRun, Any]) -> Any:
    return default_ct[1]


@pytest.fixture(scope="module")
def provisioned(default_ct: tuple[PlaybookRun, Any]) -> PlaybookRun:
    """CT 150's first provision; each case below leaves it converged again (its rerun fixes what it did)."""
    first = default_ct[0]
    assert first.rc == 0, first.output[-4000:]
    return first


def changed_inside(run: PlaybookRun) -> list[str]:
    """Tasks that changed something in the container (the node's plays are not this test's)."""
    tasks, current = [], ""
    for line in run.output.splitlines():
        if line.startswith("TASK ["):
            current = line.strip("* ")
        elif line.startswith(f"changed: [testbed-ct{VMID}]"):
            tasks.append(current)
    return tasks


def einops() -> str:
    from tbhelpers import attach

    r = attach(VMID, f"{VENV}/bin/python -c 'import importlib.metadata as m; print(m.version(\"einops\"))'")
    return r.stdout.strip() or r.stderr.strip().splitlines()[-1]


# (what is done inside, what the role says it found, the only tasks that may change)
CHANGES = {
    "pip install over the locked venv": (
        UV.format("install einops==0.8.1"),
        "venv changed since its build: added einops-0.8.1.dist-info gone einops-0.8.2.dist-info",
        {"Build the venv from the lock", "Install the doctor into the venv"},
    ),
    "a package removed from the venv": (
        UV.format("uninstall einops"),
        "venv changed since its build: gone einops einops-0.8.2.dist-info",
        {"Build the venv from the lock", "Install the doctor into the venv"},
    ),
    "the shell environment removed": (
        "rm /etc/profile.d/mlstack.sh",
        "env missing",
        {"Write the shell environment"},
    ),
    "apt's bounds edited": (
        "echo '// edited' >> /etc/apt/apt.conf.d/80mlstack-bounds",
        "toolchain: apt_bounds content differs",
        {"Bound apt's waits and retries inside the container"},
    ),
}


@pytest.mark.parametrize("change", CHANGES, ids=list(CHANGES))
def test_a_rerun_fixes_only_what_differs(provisioned: PlaybookRun, run_module: Any, change: str) -> None:
    from tbhelpers import attach

    script, said, may_change = CHANGES[change]
    done = attach(VMID, script, timeout=300)
    assert done.returncode == 0, done.stderr
    again = run_module("provision.yml", CT)
    assert again.rc == 0, again.output[-4000:]
    assert said in " ".join(again.output.split()), again.output[-6000:]
    changed = changed_inside(again)
    assert changed and all(any(task in c for task in may_change) for c in changed), changed
    # The stack is the lock's again, and the next rerun takes the fast path with nothing to change.
    assert einops() == "0.8.2"
    third = run_module("provision.yml", CT)
    assert third.rc == 0 and changed_inside(third) == [], third.changed_tasks()
    assert "nothing to do" in " ".join(third.output.split())
