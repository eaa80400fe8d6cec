"""The doctor's scheduled runs inside a container: systemd timers running mlstack-doctor-monitor.

`python -m mlstack_doctor.ops.schedule apply SPEC` writes the monitor script and one service and one timer
per tier, removes the units of tiers no longer scheduled, and enables and starts the timers;
`... remove SPEC` takes it all away. Each prints one JSON object saying what it changed, so Ansible
(roles/doctor_monitor) does the whole job in one command and reports changed only when something was.

SPEC is a JSON object:
  script       path of the monitor script (e.g. /usr/local/sbin/mlstack-doctor-monitor)
  unit_dir     systemd's folder for the units (e.g. /etc/systemd/system)
  metrics_dir  where doctor.prom and each tier's report go
  settings     venv (the venv whose doctor runs, resolved at each run), when_busy (boolean); and, only
               where the schedule's runs differ from the container's doctor settings (mlstack_doctor.settings,
               which the doctor role writes and every run reads), model, purpose, triton_cache_root
               (strings) and expect_gpu (boolean)
  runs         [{tier, timeout_s, every_min, calendar}]: every_min > 0 repeats every that many minutes,
               else calendar is a systemd OnCalendar expression
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from mlstack_doctor.files import write_atomic
from mlstack_doctor.settings import PURPOSES

UNIT_PREFIX = "mlstack-doctor-"
TIER = re.compile(r"^[a-z][a-z0-9_-]*$")
WRITTEN_BY = "# Written by python -m mlstack_doctor.ops.schedule (provision.yml); edits are replaced."
SETTINGS = ("venv", "triton_cache_root", "model", "purpose", "expect_gpu", "when_busy")

Systemctl = Callable[[Sequence[str]], "subprocess.CompletedProcess[str]"]


@dataclass(frozen=True)
class Run:
    tier: str
    timeout_s: int
    every_min: int
    calendar: str


@dataclass(frozen=True)
class Spec:
    script: Path
    unit_dir: Path
    metrics_dir: Path
    settings: dict[str, Any]
    runs: tuple[Run, ...]


def _int(value: object, what: str, minimum: int) -> int:
    if isinstance(value, str) and value.isdigit():  # a templated number may arrive as its text
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{what} must be a whole number >= {minimum}, not {value!r}")
    return value


def _flag(value: object) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in ("1", "true", "yes", "on")
    return bool(value)


def _parse_run(raw: dict[str, Any]) -> Run:
    tier = str(raw.get("tier", ""))
    if not TIER.match(tier):
        raise ValueError(f"a tier must be a lower-case word (it names the units), not {tier!r}")
    every_min = _int(raw.get("every_min", 0), f"{tier}: every_min", 0)
    calendar = str(raw.get("calendar", ""))
    if every_min == 0 and not re.match(r"^[^\n%]+$", calendar):
        raise ValueError(f"{tier}: calendar must be a systemd OnCalendar expression on one line")
    return Run(tier, _int(raw.get("timeout_s"), f"{tier}: timeout_s", 1), every_min, calendar)


def parse_spec(raw: dict[str, Any]) -> Spec:
    """SPEC as JSON-decoded, checked; ValueError says what is wrong."""
    missing = [k for k in ("script", "unit_dir", "metrics_dir", "settings", "runs") if k not in raw]
    if missing:
        raise ValueError(f"the spec lacks {', '.join(missing)}")
    unknown = sorted(set(raw["settings"]) - set(SETTINGS))
    if unknown:
        raise ValueError(f"unknown settings: {', '.join(unknown)} (known: {', '.join(SETTINGS)})")
    if not raw["settings"].get("venv"):
        raise ValueError("settings.venv is required: the venv whose doctor runs")
    purpose = raw["settings"].get("purpose")
    if purpose not in (None, "", *PURPOSES):
        raise ValueError(f"settings.purpose must be one of {', '.join(PURPOSES)} (or unset), not {purpose!r}")
    runs = tuple(_parse_run(r) for r in raw["runs"])
    tiers = [r.tier for r in runs]
    if len(set(tiers)) != len(tiers):
        raise ValueError(f"each run needs a tier of its own (units are named after it): {tiers}")
    return Spec(Path(raw["script"]), Path(raw["unit_dir"]), Path(raw["metrics_dir"]), raw["settings"], runs)


def _given(value: object) -> str:
    """An override as the script holds it: its text, or empty (the doctor's settings decide)."""
    return "" if value is None else str(value)


def render_script(spec: Spec) -> str:
    """The monitor script: its settings, then the body shipped with the doctor (monitor.sh). What the
    schedule does not override is left empty: the doctor takes it from the container's settings file."""
    s = spec.settings
    expect_gpu = s.get("expect_gpu")
    values = {
        "venv": str(s["venv"]),
        "metrics_dir": str(spec.metrics_dir),
        "triton_cache_root": _given(s.get("triton_cache_root")),
        "model": _given(s.get("model")),
        "purpose": _given(s.get("purpose")),
        "expect_gpu": "" if expect_gpu in (None, "") else "yes" if _flag(expect_gpu) else "no",
        "when_busy": "yes" if _flag(s.get("when_busy", False)) else "no",
    }
    head = ["#!/bin/sh", WRITTEN_BY]
    head += [f"{k}={shlex.quote(v)}" for k, v in values.items()]
    body = resources.files("mlstack_doctor.ops").joinpath("monitor.sh").read_text(encoding="utf-8")
    return "\n".join(head) + "\n" + body


def render_service(spec: Spec, run: Run) -> str:
    return (
        f"{WRITTEN_BY}\n"
        "[Unit]\n"
        f"Description=mlstack doctor, {run.tier} tier: check the ML stack and write its metrics\n\n"
        "[Service]\n"
        "Type=oneshot\n"
        f"ExecStart={spec.script} {run.tier} {run.timeout_s}\n"
        "# The script stops the doctor after its limit; this stops the script (and what it left) after\n"
        "# a margin.\n"
        f"TimeoutStartSec={run.timeout_s + 60}\n"
        "# Training in this container comes first.\n"
        "Nice=10\n"
    )


def render_timer(run: Run) -> str:
    if run.every_min > 0:
        when = f"every {run.every_min} min"
        timer = (
            "# In a container, OnBootSec counts from the container's start.\n"
            f"OnBootSec={run.every_min}min\n"
            f"OnUnitActiveSec={run.every_min}min\n"
        )
    else:
        when = "daily"
        timer = (
            f"OnCalendar={run.calendar}\n"
            "# Spread, so a node's containers do not all run at once; a run missed while the container was\n"
            "# down runs when it starts.\n"
            "RandomizedDelaySec=30min\n"
            "Persistent=true\n"
        )
    return (
        f"{WRITTEN_BY}\n"
        f"[Unit]\nDescription=mlstack doctor, {run.tier} tier, {when}\n\n"
        f"[Timer]\n{timer}\n[Install]\nWantedBy=timers.target\n"
    )


def _write_if_changed(path: Path, text: str, mode: int) -> bool:
    try:
        same = path.read_text(encoding="utf-8") == text and (path.stat().st_mode & 0o7777) == mode
    except (OSError, UnicodeDecodeError):
        same = False
    if same:
        return False
    write_atomic(path, text)
    os.chmod(path, mode)
    return True


def _systemctl(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["systemctl", *args], capture_output=True, text=True, timeout=120, check=False)


def _must(systemctl: Systemctl, *args: str, unless_said: str = "") -> str:
    """systemctl's output; a failure raises, except one whose message holds `unless_said`."""
    r = systemctl(args)
    if r.returncode != 0 and not (unless_said and unless_said in r.stderr):
        raise RuntimeError(f"systemctl {' '.join(args)} failed (exit {r.returncode}): {r.stderr.strip()}")
    return r.stdout.strip()


def _our_units(unit_dir: Path) -> list[str]:
    if not unit_dir.is_dir():
        return []
    names = (p.name for p in unit_dir.iterdir())
    return sorted(n for n in names if n.startswith(UNIT_PREFIX) and n.endswith((".service", ".timer")))


def _drop_units(spec: Spec, units: list[str], systemctl: Systemctl) -> list[str]:
    """Stop, disable and delete `units`; their tiers' series go with the metrics file (the scheduled
    tiers write it again), so none is left to go stale."""
    done: list[str] = []
    timers = [u for u in units if u.endswith(".timer")]
    services = [u for u in units if u.endswith(".service")]
    if timers:
        _must(systemctl, "disable", "--now", *timers)
    if services:
        # A run its timer started may still be going: stopped and waited for, it writes no metrics after
        # they are removed. A unit systemd never loaded (written by hand, no daemon-reload) has no run.
        _must(systemctl, "stop", *services, unless_said="not loaded")
    for unit in units:
        (spec.unit_dir / unit).unlink(missing_ok=True)
        done.append(f"removed {spec.unit_dir / unit}")
    prom = spec.metrics_dir / "doctor.prom"
    if units and prom.exists():
        prom.unlink()
        done.append(f"removed {prom}")
    return done


# The unit file states `systemctl is-enabled` answers 0 for.
_ENABLED = frozenset({"enabled", "enabled-runtime", "alias", "static", "indirect", "generated", "transient"})


def _timer_states(systemctl: Systemctl, timers: list[str]) -> dict[str, tuple[bool, bool]]:
    """Each timer's (enabled, active), all in one systemctl call (a rerun asks nothing else)."""
    out = _must(systemctl, "show", "--property=Id,UnitFileState,ActiveState", *timers)
    states: dict[str, tuple[bool, bool]] = {}
    for block in out.split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        states[props.get("Id", "")] = (
            props.get("UnitFileState") in _ENABLED,
            props.get("ActiveState") == "active",
        )
    return states


def apply(spec: Spec, systemctl: Systemctl = _systemctl) -> list[str]:
    """Make the container's schedule match `spec`; the list says what changed (empty: nothing)."""
    done: list[str] = []
    if not spec.metrics_dir.is_dir():
        spec.metrics_dir.mkdir(parents=True, mode=0o755)
        done.append(f"created {spec.metrics_dir}")
    if _write_if_changed(spec.script, render_script(spec), 0o755):
        done.append(f"wrote {spec.script}")
    rewritten: set[str] = set()
    for run in spec.runs:
        for unit, text in (
            (f"{UNIT_PREFIX}{run.tier}.service", render_service(spec, run)),
            (f"{UNIT_PREFIX}{run.tier}.timer", render_timer(run)),
        ):
            if _write_if_changed(spec.unit_dir / unit, text, 0o644):
                rewritten.add(unit)
                done.append(f"wrote {spec.unit_dir / unit}")
    wanted = {f"{UNIT_PREFIX}{r.tier}{s}" for r in spec.runs for s in (".service", ".timer")}
    stale = [u for u in _our_units(spec.unit_dir) if u not in wanted]
    done += _drop_units(spec, stale, systemctl)
    if rewritten or stale:
        _must(systemctl, "daemon-reload")
    timers = [f"{UNIT_PREFIX}{run.tier}.timer" for run in spec.runs]
    states = _timer_states(systemctl, timers)
    for timer in timers:
        enabled, active = states.get(timer, (False, False))
        if not enabled:
            _must(systemctl, "enable", timer)
            done.append(f"enabled {timer}")
        # A timer whose schedule changed is restarted, so the new schedule applies now.
        if timer in rewritten:
            _must(systemctl, "restart", timer)
            done.append(f"restarted {timer}")
        elif not active:
            _must(systemctl, "start", timer)
            done.append(f"started {timer}")
    return done


def remove(spec: Spec, systemctl: Systemctl = _systemctl) -> list[str]:
    """Take the schedule away: timers, units, the script and the metrics file."""
    units = _our_units(spec.unit_dir)
    done = _drop_units(spec, units, systemctl)
    if units:
        _must(systemctl, "daemon-reload")
    if spec.script.exists():
        spec.script.unlink()
        done.append(f"removed {spec.script}")
    return done


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mlstack_doctor.ops.schedule",
        description="Schedule the doctor's runs in this container (systemd timers), or remove them. "
        "Prints {changed, actions} as JSON.",
    )
    p.add_argument("action", choices=("apply", "remove"))
    p.add_argument("spec", help="the schedule as a JSON object (this module's docstring)")
    args = p.parse_args(argv)
    try:
        spec = parse_spec(json.loads(args.spec))
        actions = apply(spec) if args.action == "apply" else remove(spec)
    except (ValueError, TypeError, json.JSONDecodeError) as exc:
        sys.stderr.write(f"mlstack-doctor schedule: bad spec: {exc}\n")
        return 2
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        sys.stderr.write(f"mlstack-doctor schedule: cannot {args.action} the schedule: {exc}\n")
        return 1
    json.dump({"changed": bool(actions), "actions": actions}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
