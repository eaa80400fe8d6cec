from __future__ import annotations

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
