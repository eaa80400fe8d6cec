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


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {"stage_verdicts": stage_verdicts}
