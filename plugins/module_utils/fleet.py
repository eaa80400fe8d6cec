"""The fleet report's content: one row per container from what the run left in its host's variables
(the stack chosen, the doctor's report, the driver userspace check), what changed since the previous
report (the drift view), and the containers whose driver userspace differs from their node.

Controller only (the fleet_report action); pure functions over plain data.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from ansible_collections.mlstack.pve.plugins.module_utils.driver_userspace import MISMATCH
from ansible_collections.mlstack.pve.plugins.module_utils.stack_facts import DEFAULT_PURPOSE
from ansible_collections.mlstack.pve.plugins.module_utils.stack_packages import STACK

# Worst first: one failed probe makes its stage fail.
_SEVERITY = ("fail", "warn", "pass", "skip")
# What the drift view compares of the driver, from the doctor's driver probe: (key, evidence field).
_SEEN_DRIVER = (("driver", "kernel_module"), ("libcuda", "libcuda_version"))


def stage_verdicts(probes: list[dict[str, Any]]) -> dict[str, str]:
    """Each stage's verdict, the worst status among its probes, in the order the doctor ran them."""
    verdicts: dict[str, str] = {}
    for probe in probes:
        stage, status = probe.get("stage", "?"), probe.get("status", "skip")
        current = verdicts.get(stage)
        if current is None or _SEVERITY.index(status) < _SEVERITY.index(current):
            verdicts[stage] = status
    return verdicts


def stage_reasons(probes: list[dict[str, Any]]) -> dict[str, str]:
    """For each stage whose verdict is warn or fail, why in a word or two: the diagnosis codes of its
    probes with that status (or their names where they have none), each once, in the doctor's order."""
    reasons = {}
    for stage, verdict in stage_verdicts(probes).items():
        if verdict not in ("warn", "fail"):
            continue
        said = [
            p.get("code") or p.get("name", "?")
            for p in probes
            if p.get("stage", "?") == stage and p.get("status", "skip") == verdict
        ]
        reasons[stage] = ", ".join(dict.fromkeys(said))
    return reasons


def fleet_stack(container: dict[str, Any], choice: dict[str, Any] | None = None) -> dict[str, Any]:
    """A container's effective stack for the report: profile, extras, purpose, and for the profile and
    the extras whether the inventory named them or the stack policy chose them."""
    explicit = (choice or {}).get("explicit") or {}
    return {
        "profile": container.get("profile") or "",
        "extras": list(container.get("extras") or []),
        "purpose": container.get("purpose") or DEFAULT_PURPOSE,
        "profile_from": "inventory" if explicit.get("profile", choice is None) else "policy",
        "extras_from": "inventory" if explicit.get("extras", choice is None) else "policy",
    }


def stack_cell(stack: dict[str, Any], key: str) -> str:
    """One markdown cell: `torch211-triton37-fla06 (policy)`, `tilelang (policy)`, `none (inventory)`."""
    value = stack.get(key)
    text = (", ".join(value) or "none") if isinstance(value, list) else str(value or "-")
    source = stack.get(f"{key}_from")
    return f"{text} ({source})" if source else text


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
    seen = {dist: str(installed[dist]) for dist in STACK if installed.get(dist)}
    seen |= {key: str(driver[field]) for key, field in _SEEN_DRIVER if driver.get(field)}
    return seen


def row(name: str, hostvars: Mapping[str, Any]) -> dict[str, Any]:
    """One container's row from its host's variables: where it runs, its effective stack (the stack
    policy's choice, not only what the inventory said), what its doctor run saw and judged (each
    stage's verdict, and for a warn or fail why), and its driver userspace check (None where not
    checked)."""
    report = hostvars.get("doctor_report")
    reached = "doctor_report" in hostvars
    stack = fleet_stack(hostvars.get("mlstack_container", {}), hostvars.get("mlstack_stack_choice"))
    userspace = hostvars.get("nvidia_userspace_check")
    doctor = report if isinstance(report, dict) else {}
    probes = doctor.get("probes") or []
    return {
        "node": hostvars.get("mlstack_pve_host", ""),
        "container": name,
        "vmid": hostvars.get("proxmox_vmid", ""),
        **stack,
        "reached_doctor": reached,
        "seen": seen_stack(report, userspace),
        "driver_userspace": userspace,
        "stages": stage_verdicts(probes),
        "stage_reasons": stage_reasons(probes),
        "root_cause": (doctor.get("summary") or {}).get("root_cause"),
        # Its creation stamp ({created, id}; None where it has none) and, where this run built or checked
        # its venv, whether the venv was already complete in the node's store.
        "identity": hostvars.get("fleet_report_identity"),
        "venv_reused": hostvars.get("ml_venv_reused"),
    }


def userspace_mismatches(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows whose driver userspace differs from their node's kernel module, each as
    {container, vmid, node, driver, libcuda, summary, fix}."""
    out = []
    for r in rows:
        check = r.get("driver_userspace") or {}
        if check.get("status") != MISMATCH:
            continue
        out.append(
            {
                "container": r.get("container"),
                "vmid": r.get("vmid"),
                "node": r.get("node"),
                "driver": check.get("node"),
                "libcuda": check.get("libcuda"),
                "summary": check.get("summary"),
                "fix": check.get("fix"),
            }
        )
    return out


def _text(value: Any) -> str:
    return "none" if value in (None, "") else str(value)


def _changes(before: dict[str, Any], now: dict[str, Any], what: str = "") -> list[str]:
    """`<what><key>: old -> new` for each key of `now` whose value differs from `before`'s."""
    return [
        f"{what}{key}: {_text(before.get(key))} -> {_text(value)}"
        for key, value in now.items()
        if before.get(key) != value
    ]


def recreated(old: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """A container destroyed and created again under its name since the previous report: its creation
    stamp differs (a report or a container without one tells nothing), and where its venv came from."""
    before, stamp = old.get("identity") or {}, now.get("identity") or {}
    if not before.get("id") or not stamp.get("id") or before["id"] == stamp["id"]:
        return []
    venv = {
        True: "; its venv came from the node's store (complete there, not rebuilt)",
        False: "; its venv was built anew",
    }.get(now.get("venv_reused"), "")
    return [
        f"recreated: missing since the previous report and created again {stamp.get('created')}"
        f" (the one reported before was created {before.get('created')}){venv}"
    ]


def _container_drift(old: dict[str, Any], now: dict[str, Any]) -> list[str]:
    changes = recreated(old, now)
    changes += _changes({"profile": old.get("profile")}, {"profile": now.get("profile")})
    if not now.get("reached_doctor"):
        return [*changes, "not reached by the doctor: its stack and verdicts not compared"]
    # What this run did not see (the container not reached, a probe or stage skipped by a lower tier)
    # is no change: only what it saw is compared.
    old_seen = old.get("seen") or {}
    changes += _changes(old_seen, {k: v for k, v in (now.get("seen") or {}).items() if k in old_seen})
    old_stages = old.get("stages") or {}
    stages = {k: v for k, v in (now.get("stages") or {}).items() if v != "skip" and k in old_stages}
    changes += _changes(old_stages, stages, "stage ")
    code = (now.get("root_cause") or {}).get("code")
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


def drift(rows: list[dict[str, Any]], previous: dict[str, Any] | str | None) -> dict[str, Any]:
    """What changed per container since the previous fleet report (fleet.json, as text or as read):
    the stack the doctor saw (versions, the node's driver, the container's libcuda), the profile, each
    stage's verdict and the root cause. A container the previous report lacks is new; one it had that
    this run lacks is gone (destroyed, or not in this run's inventory)."""
    previous, unusable = _previous_report(previous)
    before = {r.get("container"): r for r in previous.get("containers") or [] if isinstance(r, dict)}
    containers = {
        r["container"]: (
            _container_drift(before[r["container"]], r)
            if r["container"] in before
            else ["new: not in the previous report"]
        )
        for r in rows
    }
    return {
        "since": previous.get("generated"),
        "containers": containers,
        "gone": [name for name in before if name not in containers],
        "unusable": unusable,
        "first": not previous and unusable is None,
    }


def document(rows: list[dict[str, Any]], previous: str | None, generated: str) -> dict[str, Any]:
    """fleet.json's content: this run's rows, what changed since the previous report, the mismatches."""
    return {
        "generated": generated,
        "containers": rows,
        "drift": drift(rows, previous or ""),
        "userspace_mismatches": userspace_mismatches(rows),
    }


def as_json(doc: dict[str, Any]) -> str:
    """As the to_nice_json filter writes it, and a final newline."""
    return json.dumps(doc, indent=4, sort_keys=True, separators=(",", ": ")) + "\n"
