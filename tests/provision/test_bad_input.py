"""Bad inventory input fails in the preflight play, before any change, with a message that says
what to fix. Each case runs provision.yml for real against the testbed."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from mlstack_testbed import client
from playbook_runner import REPO, VENV_BIN, PlaybookRun, container, record_run
from tbhelpers import ct_exists as exists

# What Ansible prints when a role's argument spec refuses its variables: none of it may reach the user.
SPEC_DUMP = ("argument_spec_data", "Supported parameters include", "Validation of arguments failed")

CASES = {
    "unknown profile": ([container(121, profile="torch99-nosuch")], "unknown profile 'torch99-nosuch'"),
    "duplicate vmid": (
        [container(122), container(122, hostname="t-122b")],
        "Container 122 (t-122) on testbed: vmid 122 is also the vmid of t-122b on testbed.",
    ),
    "duplicate hostname": (
        [container(123), container(124, hostname="t-123")],
        "Container 124 on testbed: hostname t-123 is also the hostname of Container 123 on testbed.",
    ),
    "misspelt key": (
        [{**container(320), "memroy_mb": 2048}],
        "Container 320 on testbed: memroy_mb: did you mean memory_mb?",
    ),
    "GPU listed twice": (
        [container(321, gpus=[0, 0])],
        "Container 321 on testbed: gpus [0, 0] lists GPU 0 more than once: list each GPU once.",
    ),
    "a string where a number goes": (
        [container(322, cores="four")],
        "Container 322 on testbed: expected cores a whole number above 0 (not 'four').",
    ),
    "GPU index the node lacks": ([container(125, gpus=[7])], "not present on the node"),
    "missing model path": (
        [container(126, model_path="/srv/no/such/model")],
        "model_path /srv/no/such/model does not exist on testbed",
    ),
    "shell metacharacters in hostname": (
        [container(127, hostname="x;touch /tmp/pwned")],
        "hostname a DNS label",
    ),
}


@pytest.mark.parametrize(("containers", "message"), list(CASES.values()), ids=list(CASES))
def test_bad_input_fails_before_any_change(
    run_playbook: Any, api: Any, testbed: Any, containers: list[dict[str, Any]], message: str
) -> None:
    result = run_playbook("provision.yml", containers, timeout=300)
    assert result.rc != 0
    assert message in " ".join(result.output.split()), result.output[-3000:]
    assert not [said for said in SPEC_DUMP if said in result.output], result.output[-3000:]
    assert result.changed() == 0, result.recap()
    for entry in containers:
        assert not exists(api, testbed.node, int(entry["vmid"]))


def test_vmid_of_a_guest_that_is_not_ours_is_refused(
    run_playbook: Any, api: Any, testbed: Any, foreign_ct: int
) -> None:
    result = run_playbook("provision.yml", [container(foreign_ct)], timeout=300)
    assert result.rc != 0
    assert f"vmid {foreign_ct} is already used by lxc 'not-ours'" in " ".join(result.output.split())
    assert result.changed() == 0, result.recap()
    config = api.nodes(testbed.node).lxc(foreign_ct).config.get()
    assert "mlstack" not in str(config.get("tags", "")) and "dev0" not in config


# Mistakes of one run in a copy of inventory/testbed, on two of its nodes: each is one line of the run's
# output, all of them listed by the first task (before any role), and nothing changes.
MISTAKES = {
    "testbed": [
        {"vmid": 320, "hostname": "t-320", "cores": 1, "memroy_mb": 2048, "disk_gb": 16},
        {"vmid": 321, "hostname": "t-321", "cores": 1, "memory_mb": 2048, "disk_gb": 16, "gpus": [0, 0]},
        {"vmid": 322, "hostname": "t-322", "cores": 1, "memory_mb": 2048, "disk_gb": 16, "gpus": [7]},
        {"vmid": 323, "hostname": "t-323", "cores": "four", "memory_mb": 2048, "disk_gb": 16},
    ],
    "testbed2": [
        {"vmid": 320, "hostname": "t-324", "cores": 1, "memory_mb": 2048, "disk_gb": 16},
        {"vmid": 325, "hostname": "t-323", "cores": 1, "memory_mb": 2048, "disk_gb": 16},
    ],
}
LINES = [
    "Container 320 on testbed: memroy_mb: did you mean memory_mb?",
    "Container 321 on testbed: gpus [0, 0] lists GPU 0 more than once: list each GPU once."
    " Fix the inventory entry.",
    "Container 322 on testbed: GPU index(es) [7] not present on the node (has [0, 1])."
    " Fix the inventory entry (or the node, where a GPU is missing from it).",
    "Container 323 on testbed: expected cores a whole number above 0 (not 'four'). Fix the inventory entry.",
    "Container 320 (t-320) on testbed: vmid 320 is also the vmid of t-324 on testbed2."
    " Each container needs its own vmid.",
    "Container 323 on testbed: hostname t-323 is also the hostname of Container 325 on testbed2."
    " Each container needs its own hostname.",
    "Container 320 (t-324) on testbed2: vmid 320 is also the vmid of t-320 on testbed."
    " Each container needs its own vmid.",
    "Container 325 on testbed2: hostname t-323 is also the hostname of Container 323 on testbed."
    " Each container needs its own hostname.",
]


@pytest.fixture
def mistaken_inventory(tmp_path: Path, testbed: Any) -> Path:
    """inventory/testbed copied, its containers replaced by MISTAKES (CT 100's entry left out: nothing of
    this run may reach it), testbed2 added as the testbed's state describes it."""
    copy = tmp_path / "testbed"
    shutil.copytree(REPO / "inventory" / "testbed", copy)
    hosts = yaml.safe_load((copy / "hosts.yml").read_text())
    nodes = {n["name"]: n for n in client.load().nodes}
    listed = hosts["all"]["children"]["pve_hosts"]["hosts"]
    for name, entries in MISTAKES.items():
        listed.setdefault(
            name, {"ansible_host": nodes[name]["ssh_host"], "ansible_port": nodes[name]["ssh_port"]}
        )
        listed[name]["mlstack_containers"] = entries
    (copy / "hosts.yml").write_text(yaml.safe_dump(hosts))
    return copy


def test_every_mistake_of_a_run_is_one_line_and_nothing_changes(
    mistaken_inventory: Path, api: Any, testbed: Any
) -> None:
    argv = [str(VENV_BIN / "ansible-playbook"), "-i", str(mistaken_inventory), "provision.yml"]
    env = dict(os.environ, ANSIBLE_CONFIG=str(REPO / "ansible.cfg"), ANSIBLE_NOCOLOR="1")
    before, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, env=env, timeout=300, check=False)
    run = PlaybookRun(proc.returncode, proc.stdout + proc.stderr)
    record_run("provision.yml", run, time.monotonic() - t0, before)
    assert run.rc != 0
    said = [line.strip() for line in run.output.splitlines()]
    assert [line for line in LINES if line not in said] == [], run.output[-4000:]
    assert not [dump for dump in SPEC_DUMP if dump in run.output], run.output[-4000:]
    assert run.output.count("\nTASK [") == 1, "the run went past the entries' check"
    assert run.changed() == 0, run.recap()
    for node, entries in MISTAKES.items():
        for entry in entries:
            assert not exists(api, node, int(entry["vmid"]))
