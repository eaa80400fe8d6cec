"""Filters for the fleet report."""

from __future__ import annotations

import json
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


# What the drift view compares, in its order: the stack the doctor saw, then the verdicts.
_SEEN_PACKAGES = ("torch", "triton", "flash-linear-attention", "fla-core", "transformers")
_SEEN_DRIVER = (("driver", "kernel_module"), ("libcuda", "libcuda_version"))


def _probe(report: dict[str, Any], name: str) -> dict[str, Any]:
    return next((p for p in report.get("probes") or [] if p.get("name") == name), {})


def seen_stack(report: dict[str, Any] | None, userspace: dict[str, Any] | None = None) -> dict[str, str]:
    """What a doctor report saw of the stack: package versions, the node's driver (kernel module) and
    the container's libcuda. A key is absent where the run did not see it (a skipped probe). Where the
    doctor did not see the driver or libcuda (--no-gpu skips its driver probe), the driver userspace
    check's reading (`userspace`, driver_userspace's record) stands in."""
    seen = _doctor_seen(report) if report else {}
    check = userspace or {}
    for key, field in (("driver", "node"), ("libcuda", "libcuda")):
        if key not in seen and check.get(field):
            seen[key] = str(check[field])
    return seen


def _doctor_seen(report: dict[str, Any]) -> dict[str, str]:
    packages = _probe(report, "package_versions").get("evidence") or {}
    installed = {
        **(_probe(report, "torch_triton_pin").get("evidence") or {}),
        **(packages.get("installed") or {}),
    }
    driver = _probe(report, "nvidia_driver").get("evidence") or {}
    seen = {dist: str(installed[dist]) for dist in _SEEN_PACKAGES if installed.get(dist)}
    seen |= {key: str(driver[field]) for key, field in _SEEN_DRIVER if driver.get(field)}
    return seen


def _text(value: Any) -> str:
    return "none" if value in (None, "") else str(value)


def _changes(before: dict[str, Any], now: dict[str, Any], what: str = "") -> list[str]:
    """`<what><key>: old -> new` for each key of `now` whose value differs from `before`'s."""
    return [
        f"{what}{key}: {_text(before.get(key))} -> {_text(value)}"
        for key, value in now.items()
        if before.get(key) != value
    ]


def _container_drift(old: dict[str, Any], row: dict[str, Any]) -> list[str]:
    changes = _changes({"profile": old.get("profile")}, {"profile": row.get("profile")})
    if not row.get("reached_doctor"):
        return [*changes, "not reached by the doctor: its stack and verdicts not compared"]
    # What this run did not see (the container not reached, a probe or stage skipped by a lower tier)
    # is no change: only what it saw is compared.
    old_seen = old.get("seen") or {}
    changes += _changes(old_seen, {k: v for k, v in (row.get("seen") or {}).items() if k in old_seen})
    old_stages = old.get("stages") or {}
    stages = {k: v for k, v in (row.get("stages") or {}).items() if v != "skip" and k in old_stages}
    changes += _changes(old_stages, stages, "stage ")
    code = (row.get("root_cause") or {}).get("code")
    changes += _changes({"root cause": (old.get("root_cause") or {}).get("code")}, {"root cause": code})
    return changes


def _previous_report(previous: dict[str, Any] | str | None) -> tuple[dict[str, Any], str | None]:
    """The previous fleet.json (its text, or as read), and why it cannot be used, if so."""
    if isinstance(previous, str):
        if not previous.strip():
            return {}, None
        try:
            previous = json.loads(previous)
        except ValueError as exc:
            return {}, f"the previous fleet.json is not JSON ({exc}): nothing to compare with"
    if previous is None:
        return {}, None
    if not isinstance(previous, dict) or not isinstance(previous.get("containers", []), list):
        return {}, "the previous fleet.json is not a fleet report: nothing to compare with"
    return previous, None


def fleet_drift(rows: list[dict[str, Any]], previous: dict[str, Any] | str | None) -> dict[str, Any]:
    """What changed per container since the previous fleet report (fleet.json, as text or as read):
    the stack the doctor saw (versions, the node's driver, the container's libcuda), the profile, each
    stage's verdict and the root cause. A container the previous report lacks is new; one it had that
    this run lacks is gone (destroyed, or not in this run's inventory)."""
    previous, unusable = _previous_report(previous)
    before = {r.get("container"): r for r in previous.get("containers") or [] if isinstance(r, dict)}
    containers = {
        row["container"]: (
            _container_drift(before[row["container"]], row)
            if row["container"] in before
            else ["new: not in the previous report"]
        )
        for row in rows
    }
    return {
        "since": previous.get("generated"),
        "containers": containers,
        "gone": [name for name in before if name not in containers],
        "unusable": unusable,
        "first": not previous and unusable is None,
    }


class FilterModule:
    def filters(self) -> dict[str, Any]:
        return {
            "stage_verdicts": stage_verdicts,
            "fleet_stack": fleet_stack,
            "stack_cell": stack_cell,
            "seen_stack": seen_stack,
            "fleet_drift": fleet_drift,
        }
