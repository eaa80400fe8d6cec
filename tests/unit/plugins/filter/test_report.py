from __future__ import annotations

import json

from ansible_collections.mlstack.pve.plugins.filter.report import stage_verdicts


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
    from ansible_collections.mlstack.pve.plugins.filter.report import fleet_stack, stack_cell

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
    from ansible_collections.mlstack.pve.plugins.filter.report import fleet_stack, stack_cell

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
    from ansible_collections.mlstack.pve.plugins.filter.report import seen_stack

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
    from ansible_collections.mlstack.pve.plugins.filter.report import fleet_drift

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
    drift = fleet_drift(rows, json.dumps(previous))
    assert drift["since"] == "2026-12-01T10:00:00Z" and drift["first"] is False
    assert drift["containers"] == {
        "n-ct1": [
            "driver: 575.57.08 -> 580.65.06",
            "stage host: pass -> fail",
            "root cause: none -> DRIVER_API_MISMATCH",
        ],
        "n-ct2": [],
        "n-ct4": ["new: not in the previous report"],
    }
    assert drift["gone"] == ["n-ct3"]


def test_fleet_drift_without_a_usable_previous_report_says_so() -> None:
    from ansible_collections.mlstack.pve.plugins.filter.report import fleet_drift

    rows = [_row("n-ct1", {}, {})]
    first = fleet_drift(rows, "")
    assert first["first"] is True and first["unusable"] is None and first["since"] is None
    broken = fleet_drift(rows, "{not json")
    assert broken["first"] is False and "is not JSON" in broken["unusable"]
    assert "not a fleet report" in fleet_drift(rows, "[1, 2]")["unusable"]
    # A container the doctor did not reach this time: its stack and verdicts are not compared.
    previous = {"containers": [_row("n-ct1", {"torch": "2.11.0"}, {"host": "pass"})]}
    assert fleet_drift([_row("n-ct1", {}, {}, reached=False)], previous)["containers"] == {
        "n-ct1": ["not reached by the doctor: its stack and verdicts not compared"]
    }
