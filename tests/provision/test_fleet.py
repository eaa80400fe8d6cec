"""One run of provision.yml across the three nodes of the testbed's cluster, one container each (CT 130 on
testbed, 131 on testbed2, 132 on testbed3), the way a fleet is provisioned: each container made on its own
node through the cluster's API and reached through its node's SSH and pct, one fleet report for all, a
rerun that changes nothing, and destroy.yml across the nodes."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from playbook_runner import PlaybookRun, container, make_runner

PLACEMENT = {"testbed": 130, "testbed2": 131, "testbed3": 132}
CTS = {node: [container(vmid)] for node, vmid in PLACEMENT.items()}


def placed(api: Any) -> dict[int, str]:
    """vmid -> node, for this test's containers, as the cluster's API lists them."""
    rows = api.cluster.resources.get(type="vm")
    return {int(r["vmid"]): r["node"] for r in rows if int(r["vmid"]) in PLACEMENT.values()}


def report_vars(reports: Path) -> dict[str, str]:
    """Reports of this test's runs in its own folder; the doctor's NCCL tier run in every container (gloo,
    2 ranks: the testbed's GPUs have no driver)."""
    return {
        "fleet_report_dir": str(reports),
        "doctor_controller_report_dir": str(reports / "doctor"),
        "mlstack_doctor_nccl": "always",
    }


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory, testbed: Any) -> Iterator[dict[str, Any]]:
    work = tmp_path_factory.mktemp("fleet")
    run = make_runner(work)
    reports = work / "reports"
    run("destroy.yml", CTS, mlstack_destroy_confirm=True)
    first = run("provision.yml", CTS, **report_vars(reports))
    yield {"run": run, "first": first, "reports": reports}
    run("destroy.yml", CTS, mlstack_destroy_confirm=True)


def test_each_container_is_made_on_its_own_node(fleet: dict[str, Any], api: Any) -> None:
    first: PlaybookRun = fleet["first"]
    assert first.rc == 0, first.output[-4000:]
    assert placed(api) == {vmid: node for node, vmid in PLACEMENT.items()}
    recap = first.recap()
    for node, vmid in PLACEMENT.items():
        assert recap[node]["failed"] == 0 and recap[f"{node}-ct{vmid}"]["failed"] == 0, recap


def test_one_fleet_report_covers_every_node(fleet: dict[str, Any]) -> None:
    report = json.loads(Path(fleet["reports"], "fleet.json").read_text())
    rows = {int(r["vmid"]): r for r in report["containers"]}
    assert {vmid: rows[vmid]["node"] for vmid in rows} == {vmid: node for node, vmid in PLACEMENT.items()}
    for row in rows.values():
        assert row["reached_doctor"] and row["root_cause"] is None, row
    md = Path(fleet["reports"], "fleet.md").read_text()
    for node, vmid in PLACEMENT.items():
        assert f"| {node} | {node}-ct{vmid} | {vmid} |" in md, md


def test_a_rerun_across_the_nodes_changes_nothing(fleet: dict[str, Any]) -> None:
    rerun = fleet["run"]("provision.yml", CTS, **report_vars(fleet["reports"]))
    assert rerun.rc == 0, rerun.output[-4000:]
    assert rerun.changed() == 0, rerun.changed_tasks()
    assert set(rerun.recap()) >= set(PLACEMENT)
    # The stack did not change: its verdicts carried over, so the NCCL tier is not run again.
    assert "TASK [doctor : Run the doctor at tier nccl]" not in rerun.output


def test_the_nccl_tier_ran_in_each_container(fleet: dict[str, Any]) -> None:
    for node, vmid in PLACEMENT.items():
        report = json.loads(Path(fleet["reports"], "doctor", f"{node}-ct{vmid}-nccl.json").read_text())
        assert report["tier"] == "nccl" and report["summary"]["ok"], report["summary"]
        verdicts = {p["name"]: p["status"] for p in report["probes"]}
        assert verdicts["nccl_collectives"] == "pass" and verdicts["nccl_bandwidth"] == "pass", verdicts


def test_destroy_removes_the_containers_of_every_node(fleet: dict[str, Any], api: Any) -> None:
    gone = fleet["run"]("destroy.yml", CTS, mlstack_destroy_confirm=True)
    assert gone.rc == 0, gone.output[-4000:]
    assert placed(api) == {}
