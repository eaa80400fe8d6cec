"""A second provision run on the same node while the first is running, both wanting the same new venv
in the shared CT (built aside: not activated, so the working venv stays as it was).

Both runs must end well, or a failed one must name its cause; the venv is built once (the second build
waits on the first's lock and reuses its result); no venv without its marker; the working venv keeps
working; and a rerun completes."""

from __future__ import annotations

import re
import threading
import time
from typing import Any

import pytest
from faultlib import ct_ls, ct_sh, one_line, venv_works

ROOT = "/opt/mlstack-faults-concurrent"
VENVS = "/var/cache/mlstack/uv/venvs/ct160-faults-concurrent"
ASIDE = {
    "ml_venv_root": ROOT,
    "ml_venv_venvs_dir": VENVS,
    "ml_venv_activate": False,
    "ml_venv_prune": False,
    "doctor_tier": "quick",
    "triton_warm_model": "tiny",
}
# What a run that lost a race may say in its failure: each names the other run's hold on a shared resource
# (the venv build's lock file, dpkg's lock, PVE's lock of the container's config).
KNOWN_CAUSES = re.compile(
    r"another build of \S+ still holds|Could not get lock|CT \d+ is locked|can't lock file|already exists"
)


def failures(output: str) -> str:
    """The failure messages of a playbook run (from each `fatal: [` to the end of its task's output),
    without the task names, which mention the lock whatever failed."""
    chunks = re.split(r"\n(?=TASK \[|PLAY RECAP)", output)
    return "\n".join(c[c.index("fatal: [") :] for c in chunks if "fatal: [" in c)


def task_block(output: str, name: str) -> str:
    """The result lines of the first task whose name contains `name` ('' when it did not run)."""
    parts = output.split("TASK [")
    block = next((p for p in parts[1:] if name in p.split("]", 1)[0]), "")
    return block.split("\n", 1)[1].strip() if "\n" in block else ""


@pytest.mark.slow
def test_concurrent_second_run_on_the_same_node(runner: Any, shared_ct: dict[str, Any]) -> None:
    vmid = int(shared_ct["vmid"])
    ct_sh(vmid, f"rm -rf {ROOT} {VENVS}")
    results: dict[str, Any] = {}

    def go(name: str, delay: float) -> None:
        time.sleep(delay)
        # -v: the build task's own words (built, or waited for the other run's build) are in the output.
        results[name] = runner("provision.yml", [shared_ct], env={"ANSIBLE_VERBOSITY": "1"}, **ASIDE)

    threads = [threading.Thread(target=go, args=(n, d)) for n, d in (("first", 0.0), ("second", 2.0))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(1800)
    first, second = results["first"], results["second"]

    # What the users saw: both runs completed, or the one that lost a race named the other's hold.
    assert first.rc == 0 or second.rc == 0, first.output[-3000:] + second.output[-3000:]
    for run in (first, second):
        if run.rc != 0:
            assert KNOWN_CAUSES.search(one_line(failures(run.output))), run.output[-4000:]
    # State: one complete venv, built once (a second build waits for the first and reuses it); nothing
    # half-built; the working venv untouched.
    blocks = [task_block(r.output, "Build the venv from the lock") for r in (first, second)]
    fresh_builds = [b for b in blocks if "changed: [" in b and "already complete" not in one_line(b)]
    assert len(fresh_builds) <= 1, blocks
    built = [n for n in ct_ls(vmid, VENVS) if not n.endswith(".lock")]
    assert len(built) == 1 and not built[0].endswith(".partial"), built
    assert venv_works(vmid, f"{VENVS}/{built[0]}")
    assert venv_works(vmid)

    # A rerun completes and has nothing left to build.
    again = runner("provision.yml", [shared_ct], **ASIDE)
    assert again.rc == 0, again.output[-4000:]
    # ml_venv's one state read finds the venv complete: its build steps are not even included.
    assert "Build the venv from the lock" not in again.output, again.output[-3000:]
    assert [n for n in ct_ls(vmid, VENVS) if not n.endswith(".lock")] == built  # nothing new built
    ct_sh(vmid, f"rm -rf {ROOT} {VENVS}")


@pytest.mark.parametrize(
    ("failure", "known"),
    [
        ("mlstack-build-venv: another build of /v/x still holds /v/x.lock after 3600s.", True),
        ("E: Could not get lock /var/lib/dpkg/lock-frontend. It is held by process 7 (apt-get)", True),
        ("No space left on device", False),
        ("the connection to 127.0.0.1 was lost (lock)", False),
    ],
)
def test_a_lost_race_is_named_by_its_failure_not_by_a_task_name(failure: str, known: bool) -> None:
    """A run that failed for another reason is no lost race, though its build task's name says "lock"."""
    output = (
        "TASK [ml_venv : Build the venv from the lock] ***\n"
        f'fatal: [ct160]: FAILED! => {{"msg": "{failure}"}}\n'
        "\nPLAY RECAP ***\nct160 : ok=3 changed=0 unreachable=0 failed=1\n"
    )
    assert bool(KNOWN_CAUSES.search(one_line(failures(output)))) is known
