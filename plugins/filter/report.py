"""Filters for the fleet report."""

from __future__ import annotations

from typing import Any

# Worst first: one failed probe makes its stage fail.
_SEVERITY = ("fail", "warn", "pass", "skip")


def stage_verdicts(probes: list[dict[str, Any]]) -> dict[str, str]:
    """Each stage's verdict, the worst status among its probes, in the order the doctor ran them."""
    verdicts: dict[str, str] = {}
    for probe in probes:
        stage, status = probe.get("stage", "?"), probe.get("status", "skip")
        current = verdicts.get(stage)
        if current is None or _SEVERITY.index(status) < _SEVERITY.index(current):
            verdicts[stage] = status
    return verdicts


def fleet_stack(container: dict[str, Any], choice: dict[str, Any] | None = None) -> dict[str, Any]:
    """A container's effective stack for the report: profile, extras, purpose, and for the profile and
    the extras whether the inventory named them or the stack policy chose them."""
    explicit = (choice or {}).get("explicit") or {}
    return {
        "profile": container.get("profile") or "",
        "extras": list(container.get("extras") or []),
        "purpose": container.get("purpose") or "training",
        "profile_from": "inventory" if explicit.get("profile", choice is None) else "policy",
        "extras_from": "inventory" if explicit.get("extras", choice is None) else "policy",
    }


def stack_cell(stack: dict[str, Any], key: str) -> str:
    """One markdown cell: `torch211-triton37-fla06 (policy)`, `tilelang (policy)`, `none (inventory)`."""
    value = stack.get(key)
    text = (", ".join(value) or "none") if isinstance(value, list) else str(value or "-")
    source = stack.get(f"{key}_from")
    return f"{text} ({source})" if source else text


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"stage_verdicts": stage_verdicts, "fleet_stack": fleet_stack, "stack_cell": stack_cell}
