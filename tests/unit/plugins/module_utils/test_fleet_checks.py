"""The fleet report's content (module_utils/fleet.py): stage verdicts, the effective stack and its cells,
what a doctor report saw, the rows built from a host's variables, and the drift view."""

from __future__ import annotations

import json

import pytest
from ansible_collections.mlstack.pve.plugins.module_utils.fleet import (
    drift,
    fleet_stack,
    row,
    seen_stack,
    stack_cell,
    stage_reasons,
    stage_verdicts,
)


def test_worst_status_wins_and_order_is_kept() -> None:
    probes = [
        {"stage": "host", "status": "pass"},
        {"stage": "host", "status": "warn"},
        {"stage": "toolchain", "status": "pass"},
        {"stage": "toolchain", "status": "fail"},
        {"stage": "gpu", "status": "skip"},
    ]
    assert stage_verdicts(probes) == {"host": "warn", "toolchain": "fail", "gpu": "skip"}
    assert list(stage_verdicts(probes)) == ["host", "toolchain", "gpu"]


def test_fleet_stack_says_what_the_policy_chose() -> None:
    container = {"vmid": 120, "profile": "torch211-triton37-fla06", "extras": [], "purpose": "inference"}
    choice = {"explicit": {"profile": False, "extras": False}}
    stack = fleet_stack(container, choice)
    assert stack == {
        "profile": "torch211-triton37-fla06",
        "extras": [],
        "purpose": "inference",
        "profile_from": "policy",
        "extras_from": "policy",
    }
    assert stack_cell(stack, "profile") == "torch211-triton37-fla06 (policy)"
    assert stack_cell(stack, "extras") == "none (policy)"


def test_fleet_stack_names_inventory_choices_and_defaults_the_purpose() -> None:
    container = {"vmid": 121, "profile": "torch211-triton36", "extras": ["hopper"]}
    stack = fleet_stack(container, {"explicit": {"profile": True, "extras": True}})
    assert stack["purpose"] == "training"
    assert stack_cell(stack, "profile") == "torch211-triton36 (inventory)"
    assert stack_cell(stack, "extras") == "hopper (inventory)"


def _report(torch: str = "2.11.0", driver: str | None = "575.57.08", libcuda: str | None = None) -> dict:
    probes = [
        {
            "name": "package_versions",
            "stage": "packages",
            "status": "pass",
            "evidence": {"installed": {"torch": torch}},
        },
        {
            "name": "torch_triton_pin",
            "stage": "packages",
            "status": "pass",
            "evidence": {"torch": "x", "triton": "3.7.1"},
        },
    ]
    if driver:
        evidence = {"kernel_module": driver, "libcuda_version": libcuda or driver}
        probes.append({"name": "nvidia_driver", "stage": "host", "status": "pass", "evidence": evidence})
    else:
        probes.append({"name": "nvidia_driver", "stage": "host", "status": "skip", "evidence": {}})
    return {"probes": probes}


def test_seen_stack_reads_versions_and_driver_and_leaves_out_what_was_not_seen() -> None:
    assert seen_stack(_report(libcuda="570.1")) == {
        "torch": "2.11.0",
        "triton": "3.7.1",
        "driver": "575.57.08",
        "libcuda": "570.1",
    }
    assert seen_stack(_report(driver=None)) == {"torch": "2.11.0", "triton": "3.7.1"}
    assert seen_stack(None) == {}


def _row(name: str, seen: dict, stages: dict, root_cause: dict | None = None, reached: bool = True) -> dict:
    return {
        "container": name,
        "profile": "torch211-triton37-fla06",
        "seen": seen,
        "stages": stages,
        "root_cause": root_cause,
        "reached_doctor": reached,
    }


def test_fleet_drift_names_what_changed_per_container() -> None:
    seen = {"torch": "2.11.0", "driver": "575.57.08", "libcuda": "575.57.08"}
    previous = {
        "generated": "2026-12-01T10:00:00Z",
        "containers": [
            _row("n-ct1", seen, {"host": "pass", "gpu": "pass"}),
            _row("n-ct2", seen, {"host": "pass", "gpu": "pass"}),
            _row("n-ct3", seen, {"host": "pass"}),
        ],
    }
    upgraded = {**seen, "driver": "580.65.06"}
    broken = {"code": "DRIVER_API_MISMATCH", "fix": "..."}
    rows = [
        _row("n-ct1", upgraded, {"host": "fail", "gpu": "skip"}, broken),
        _row("n-ct2", seen, {"host": "pass", "gpu": "skip"}),  # a fast tier: gpu not run, no change
        _row("n-ct4", seen, {"host": "pass"}),
    ]
    changed = drift(rows, json.dumps(previous))
    assert changed["since"] == "2026-12-01T10:00:00Z" and changed["first"] is False
    assert changed["containers"] == {
        "n-ct1": [
            "driver: 575.57.08 -> 580.65.06",
            "stage host: pass -> fail",
            "root cause: none -> DRIVER_API_MISMATCH",
        ],
        "n-ct2": [],
        "n-ct4": ["new: not in the previous report"],
    }
    assert changed["gone"] == ["n-ct3"]


def test_fleet_drift_without_a_usable_previous_report_says_so() -> None:
    rows = [_row("n-ct1", {}, {})]
    first = drift(rows, "")
    assert first["first"] is True and first["unusable"] is None and first["since"] is None
    broken = drift(rows, "{not json")
    assert broken["first"] is False and "is not JSON" in broken["unusable"]
    assert "not a fleet report" in drift(rows, "[1, 2]")["unusable"]
    # A container the doctor did not reach this time: its stack and verdicts are not compared.
    previous = {"containers": [_row("n-ct1", {"torch": "2.11.0"}, {"host": "pass"})]}
    assert drift([_row("n-ct1", {}, {}, reached=False)], previous)["containers"] == {
        "n-ct1": ["not reached by the doctor: its stack and verdicts not compared"]
    }


def test_a_row_from_a_reached_containers_variables() -> None:
    report = {
        **_report(),
        "summary": {"root_cause": {"code": "DRIVER_API_MISMATCH", "fix": "reboot"}},
    }
    report["probes"][0]["stage"] = "packages"
    userspace = {"node": "575.57.08", "libcuda": "575.57.08", "status": "match", "fix": None}
    hostvars = {
        "mlstack_pve_host": "pve1",
        "proxmox_vmid": 120,
        "mlstack_container": {"vmid": 120, "profile": "torch211-triton37-fla06", "extras": []},
        "mlstack_stack_choice": {"explicit": {"profile": False, "extras": False}},
        "doctor_report": report,
        "nvidia_userspace_check": userspace,
        "fleet_report_identity": {"created": "2026-12-01T10:00:00Z", "id": "a"},
        "ml_venv_reused": True,
        "unrelated": "ignored",
    }
    assert row("pve1-ct120", hostvars) == {
        "node": "pve1",
        "container": "pve1-ct120",
        "vmid": 120,
        "profile": "torch211-triton37-fla06",
        "extras": [],
        "purpose": "training",
        "profile_from": "policy",
        "extras_from": "policy",
        "reached_doctor": True,
        "seen": {"torch": "2.11.0", "triton": "3.7.1", "driver": "575.57.08", "libcuda": "575.57.08"},
        "driver_userspace": userspace,
        "stages": {"packages": "pass", "host": "pass"},
        "stage_reasons": {},
        "root_cause": {"code": "DRIVER_API_MISMATCH", "fix": "reboot"},
        "identity": {"created": "2026-12-01T10:00:00Z", "id": "a"},
        "venv_reused": True,
    }


def test_a_row_of_a_container_the_run_never_reached() -> None:
    assert row("pve1-ct121", {"mlstack_container": {"profile": "p", "purpose": "inference"}}) == {
        "node": "",
        "container": "pve1-ct121",
        "vmid": "",
        "profile": "p",
        "extras": [],
        "purpose": "inference",
        "profile_from": "inventory",
        "extras_from": "inventory",
        "reached_doctor": False,
        "seen": {},
        "driver_userspace": None,
        "stages": {},
        "stage_reasons": {},
        "root_cause": None,
        "identity": None,
        "venv_reused": None,
    }


def test_a_warn_or_fail_stage_says_why() -> None:
    probes = [
        {"name": "nvidia_driver", "stage": "host", "status": "warn", "code": "GPU_NODES_NO_DRIVER"},
        {"name": "causal_conv1d", "stage": "packages", "status": "warn"},
        {"name": "a", "stage": "fla", "status": "warn", "code": "FLA_SLOW"},
        {"name": "b", "stage": "fla", "status": "fail", "code": "FLA_DEVICE_CPU"},
        {"name": "c", "stage": "toolchain", "status": "pass"},
    ]
    assert stage_reasons(probes) == {
        "host": "GPU_NODES_NO_DRIVER",
        "packages": "causal_conv1d",
        "fla": "FLA_DEVICE_CPU",
    }


@pytest.mark.parametrize(
    ("reused", "said"),
    [
        (True, "; its venv came from the node's store (complete there, not rebuilt)"),
        (False, "; its venv was built anew"),
        (None, ""),
    ],
)
def test_fleet_drift_says_a_container_was_recreated(reused: bool | None, said: str) -> None:
    old = {"created": "2026-12-01T10:00:00Z", "id": "a"}
    new = {"created": "2026-12-02T09:00:00Z", "id": "b"}
    previous = {"containers": [_row("n-ct1", {}, {}) | {"identity": old}]}
    rows = [_row("n-ct1", {}, {}) | {"identity": new, "venv_reused": reused}]
    assert drift(rows, previous)["containers"]["n-ct1"] == [
        "recreated: missing since the previous report and created again 2026-12-02T09:00:00Z"
        f" (the one reported before was created 2026-12-01T10:00:00Z){said}"
    ]


@pytest.mark.parametrize("before", [None, {"created": "2026-12-02T09:00:00Z", "id": "b"}])
def test_fleet_drift_tells_nothing_without_two_different_stamps(before: dict[str, str] | None) -> None:
    previous = {"containers": [_row("n-ct1", {}, {}) | {"identity": before}]}
    rows = [_row("n-ct1", {}, {}) | {"identity": {"created": "2026-12-02T09:00:00Z", "id": "b"}}]
    assert drift(rows, previous)["containers"]["n-ct1"] == []
