"""provision.yml, a second run, verify.yml and destroy.yml on one real testbed container (CT 128) with
no profile in its inventory entry: the stack policy gives it the default for new containers, the node's
GPU architecture being unknown (the testbed's nvidia-smi answers as a node without a driver)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from playbook_runner import DEFAULT_PROFILE, REPO, PlaybookRun, container

VMID = 128
CT = [container(VMID)]


@pytest.fixture(scope="module")
def first_run(request: pytest.FixtureRequest) -> Iterator[PlaybookRun]:
    run_playbook = request.getfixturevalue("run_playbook_module")
    result = run_playbook("provision.yml", CT)
    yield result
    run_playbook("destroy.yml", CT, mlstack_destroy_confirm=True)


@pytest.fixture(scope="module")
def run_playbook_module(tmp_path_factory: pytest.TempPathFactory, testbed: Any) -> Any:
    from playbook_runner import make_runner

    return make_runner(tmp_path_factory.mktemp("lifecycle"))


def test_provision_creates_a_verified_container(first_run: PlaybookRun, api: Any, testbed: Any) -> None:
    assert first_run.rc == 0, first_run.output[-4000:]
    config = api.nodes(testbed.node).lxc(VMID).config.get()
    assert config["unprivileged"] == 1
    devices = sorted(v.split(",")[0] for k, v in config.items() if k.startswith("dev"))
    assert devices == sorted(testbed.gpu_nodes)
    fleet = json.loads((REPO / "reports" / "fleet.json").read_text())
    row = next(r for r in fleet["containers"] if str(r["vmid"]) == str(VMID))
    assert row["reached_doctor"] and row["root_cause"] is None
    assert row["stages"]["toolchain"] == "pass"


def test_the_policy_gives_the_new_default_and_says_why(first_run: PlaybookRun) -> None:
    from tbhelpers import attach

    said = " ".join(first_run.output.split())
    assert "GPU architecture unknown (nvidia-smi exited 9: NVIDIA-SMI has failed" in said, said[-4000:]
    assert f"CT {VMID}: profile {DEFAULT_PROFILE} (policy)" in said, said[-4000:]
    fleet = json.loads((REPO / "reports" / "fleet.json").read_text())
    row = next(r for r in fleet["containers"] if str(r["vmid"]) == str(VMID))
    assert (row["profile"], row["profile_from"], row["purpose"]) == (DEFAULT_PROFILE, "policy", "training")
    assert f"| {DEFAULT_PROFILE} (policy) |" in (REPO / "reports" / "fleet.md").read_text()
    # What is installed is that profile's lock: triton 3.7.1 over torch's pin, FLA 0.6.0.
    r = attach(
        VMID,
        "/opt/mlstack/venv/bin/python -c 'import importlib.metadata as m; "
        'print(m.version("triton"), m.version("fla-core"))\'',
    )
    assert r.stdout.split() == ["3.7.1", "0.6.0"], r.stderr


def test_second_run_changes_nothing(first_run: PlaybookRun, run_playbook_module: Any) -> None:
    report = REPO / "reports" / "doctor" / f"testbed-ct{VMID}.json"
    first = json.loads(report.read_text())
    again = run_playbook_module("provision.yml", CT)
    assert again.rc == 0, again.output[-4000:]
    assert again.changed() == 0, again.changed_tasks()
    # Nothing changed in the stack: the doctor ran its fast tier and carried the first run's other
    # verdicts over, saying from when.
    second = json.loads(report.read_text())
    assert second["reused"]["from"] == first["started"], second.get("reused")
    assert second["fingerprint"] == first["fingerprint"]
    fresh = {p["name"] for p in second["probes"] if "reused_from" not in p["evidence"]}
    carried = [p for p in second["probes"] if p["evidence"].get("reused_from") == first["started"]]
    assert fresh == set(second["reused"]["fast_tier_probes"]) & {p["name"] for p in first["probes"]}
    assert carried and [p["name"] for p in second["probes"]] == [p["name"] for p in first["probes"]]
    assert second["summary"]["ok"] and second["tier"] == first["tier"]


def test_verify_reruns_the_doctor_and_changes_nothing(
    first_run: PlaybookRun, run_playbook_module: Any
) -> None:
    report = REPO / "reports" / "doctor" / f"testbed-ct{VMID}.json"
    before = json.loads(report.read_text())["started"]
    result = run_playbook_module("verify.yml", CT)
    assert result.rc == 0, result.output[-4000:]
    assert result.changed() == 0, result.recap()
    after = json.loads(report.read_text())
    assert after["started"] != before
    # verify.yml verifies: the tier in full, nothing carried over.
    assert "reused" not in after and not [p for p in after["probes"] if "reused_from" in p["evidence"]]
    assert "Create the container" not in result.output
    # The drift view: compared with the report the second provision wrote, the stack is the same.
    fleet = json.loads((REPO / "reports" / "fleet.json").read_text())
    assert fleet["drift"]["since"] and fleet["drift"]["unusable"] is None
    changes = fleet["drift"]["containers"][f"testbed-ct{VMID}"]
    assert not [c for c in changes if c.split(":")[0] in ("profile", "torch", "triton", "fla-core")], changes
    assert "## Since the last report" in (REPO / "reports" / "fleet.md").read_text()


def test_destroy_refuses_without_confirmation(
    first_run: PlaybookRun, run_playbook_module: Any, api: Any, testbed: Any
) -> None:
    result = run_playbook_module("destroy.yml", CT)
    assert result.rc != 0
    assert "Rerun with -e mlstack_destroy_confirm=true" in " ".join(result.output.split())
    assert api.nodes(testbed.node).lxc(VMID).status.current.get()["status"] == "running"


def test_destroy_never_removes_a_container_that_is_not_ours(
    first_run: PlaybookRun, run_playbook_module: Any, api: Any, testbed: Any, foreign_ct: int
) -> None:
    result = run_playbook_module(
        "destroy.yml", CT, mlstack_destroy_confirm=True, mlstack_destroy_vmids=[foreign_ct]
    )
    assert result.rc == 0, result.output[-4000:]
    said = " ".join(result.output.split())
    assert f"vmid {foreign_ct} (lxc not-ours) has no mlstack tag: left alone." in said, said[-3000:]
    assert api.nodes(testbed.node).lxc(foreign_ct).status.current.get()
    assert api.nodes(testbed.node).lxc(VMID).status.current.get()["status"] == "running"


def test_destroy_with_confirmation_removes_ours(
    first_run: PlaybookRun, run_playbook_module: Any, api: Any, testbed: Any
) -> None:
    from proxmoxer.core import ResourceException

    result = run_playbook_module("destroy.yml", CT, mlstack_destroy_confirm=True)
    assert result.rc == 0, result.output[-4000:]
    with pytest.raises(ResourceException):
        api.nodes(testbed.node).lxc(VMID).status.current.get()
