"""The doctor's schedule (python -m mlstack_doctor.ops.schedule): files written only where they differ, stale
tiers removed with the metrics file, timers enabled, started or restarted as needed, and what changed
said as JSON. systemctl is the boundary stubbed here; tests/provision/test_monitor.py runs it under a
container's real systemd."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from doctor_testlib import SRC
from mlstack_doctor.ops import schedule


class FakeSystemd:
    """systemctl's answers for the units it was told about: enabled and active sets."""

    def __init__(self) -> None:
        self.enabled: set[str] = set()
        self.active: set[str] = set()
        self.calls: list[tuple[str, ...]] = []
        # Units whose files systemd never loaded (written by hand, no daemon-reload).
        self.unloaded: set[str] = set()

    def __call__(self, args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        args = tuple(args)
        self.calls.append(args)
        verb, units = args[0], [a for a in args[1:] if not a.startswith("--")]
        rc, out, err = 0, "", ""
        if verb == "show":
            out = "\n\n".join(
                f"Id={u}\nUnitFileState={'enabled' if u in self.enabled else 'disabled'}\n"
                f"ActiveState={'active' if u in self.active else 'inactive'}"
                for u in units
            )
        elif verb == "enable":
            self.enabled.update(units)
        elif verb in ("start", "restart"):
            self.active.update(units)
        elif verb == "stop":
            if self.unloaded & set(units):
                rc, err = (
                    5,
                    f"Failed to stop {' '.join(units)}: Unit {min(self.unloaded & set(units))} not loaded.",
                )
            self.active.difference_update(units)
        elif verb == "disable":
            self.enabled.difference_update(units)
            if "--now" in args:
                self.active.difference_update(units)
        return subprocess.CompletedProcess(args, rc, out, err)

    def verbs(self) -> list[str]:
        return [" ".join(c) for c in self.calls if c[0] != "show"]


def raw_spec(root: Path, daily: str = "quick", **settings: Any) -> dict[str, Any]:
    return {
        "script": str(root / "sbin/mlstack-doctor-monitor"),
        "unit_dir": str(root / "units"),
        "metrics_dir": str(root / "metrics"),
        "settings": {"venv": "/opt/mlstack/venv", "model": "tiny", "expect_gpu": True, **settings},
        "runs": [
            {"tier": "fast", "timeout_s": 300, "every_min": 5},
            {"tier": daily, "timeout_s": "3600", "every_min": 0, "calendar": "*-*-* 03:00:00"},
        ],
    }


@pytest.fixture
def systemd() -> FakeSystemd:
    return FakeSystemd()


def test_first_apply_writes_everything_and_starts_the_timers(tmp_path: Path, systemd: FakeSystemd) -> None:
    done = schedule.apply(schedule.parse_spec(raw_spec(tmp_path)), systemd)
    units = sorted(p.name for p in (tmp_path / "units").iterdir())
    assert units == [
        "mlstack-doctor-fast.service",
        "mlstack-doctor-fast.timer",
        "mlstack-doctor-quick.service",
        "mlstack-doctor-quick.timer",
    ]
    assert systemd.enabled == systemd.active == {"mlstack-doctor-fast.timer", "mlstack-doctor-quick.timer"}
    assert "daemon-reload" in systemd.verbs()
    assert f"wrote {tmp_path / 'sbin/mlstack-doctor-monitor'}" in done
    script = tmp_path / "sbin/mlstack-doctor-monitor"
    assert script.stat().st_mode & 0o777 == 0o755
    fast = (tmp_path / "units/mlstack-doctor-fast.timer").read_text()
    assert "OnUnitActiveSec=5min" in fast and "OnCalendar" not in fast
    daily = (tmp_path / "units/mlstack-doctor-quick.timer").read_text()
    assert "OnCalendar=*-*-* 03:00:00" in daily and "Persistent=true" in daily
    service = (tmp_path / "units/mlstack-doctor-quick.service").read_text()
    assert f"ExecStart={script} quick 3600" in service and "TimeoutStartSec=3660" in service


def test_a_second_apply_changes_nothing(tmp_path: Path, systemd: FakeSystemd) -> None:
    spec = schedule.parse_spec(raw_spec(tmp_path))
    schedule.apply(spec, systemd)
    systemd.calls.clear()
    assert schedule.apply(spec, systemd) == []
    assert systemd.verbs() == []  # only the timers' states were asked, in one call
    assert len(systemd.calls) == 1


def test_a_stopped_timer_is_started_again(tmp_path: Path, systemd: FakeSystemd) -> None:
    spec = schedule.parse_spec(raw_spec(tmp_path))
    schedule.apply(spec, systemd)
    systemd.active.discard("mlstack-doctor-fast.timer")
    assert schedule.apply(spec, systemd) == ["started mlstack-doctor-fast.timer"]


def test_a_changed_schedule_restarts_only_its_timer(tmp_path: Path, systemd: FakeSystemd) -> None:
    raw = raw_spec(tmp_path)
    schedule.apply(schedule.parse_spec(raw), systemd)
    raw["runs"][0]["every_min"] = 10
    done = schedule.apply(schedule.parse_spec(raw), systemd)
    assert "restarted mlstack-doctor-fast.timer" in done
    assert not [d for d in done if "quick" in d]
    assert "OnUnitActiveSec=10min" in (tmp_path / "units/mlstack-doctor-fast.timer").read_text()


def test_another_daily_tier_replaces_old_units_and_metrics(tmp_path: Path, systemd: FakeSystemd) -> None:
    schedule.apply(schedule.parse_spec(raw_spec(tmp_path)), systemd)
    prom = tmp_path / "metrics/doctor.prom"
    prom.write_text('mlstack_doctor_ok{tier="quick"} 1\n')
    done = schedule.apply(schedule.parse_spec(raw_spec(tmp_path, daily="full")), systemd)
    assert sorted(p.name for p in (tmp_path / "units").iterdir()) == [
        "mlstack-doctor-fast.service",
        "mlstack-doctor-fast.timer",
        "mlstack-doctor-full.service",
        "mlstack-doctor-full.timer",
    ]
    assert "disable --now mlstack-doctor-quick.timer" in systemd.verbs()
    assert "mlstack-doctor-quick.timer" not in systemd.enabled | systemd.active
    assert not prom.exists() and f"removed {prom}" in done


def test_remove_takes_everything_away_then_has_nothing_to_do(tmp_path: Path, systemd: FakeSystemd) -> None:
    spec = schedule.parse_spec(raw_spec(tmp_path))
    schedule.apply(spec, systemd)
    (tmp_path / "metrics/doctor.prom").write_text("x 1\n")
    (tmp_path / "metrics/doctor-fast.json").write_text("{}")
    done = schedule.remove(spec, systemd)
    assert list((tmp_path / "units").iterdir()) == []
    assert not (tmp_path / "sbin/mlstack-doctor-monitor").exists()
    assert not systemd.enabled and not systemd.active
    assert [p.name for p in (tmp_path / "metrics").iterdir()] == ["doctor-fast.json"]  # reports stay
    assert len(done) == 6
    assert schedule.remove(spec, systemd) == []


def test_a_run_under_way_is_stopped_before_the_metrics_go(tmp_path: Path, systemd: FakeSystemd) -> None:
    spec = schedule.parse_spec(raw_spec(tmp_path))
    schedule.apply(spec, systemd)
    systemd.active.add("mlstack-doctor-quick.service")  # a daily run its timer started
    schedule.remove(spec, systemd)
    verbs = systemd.verbs()
    stop = "stop mlstack-doctor-fast.service mlstack-doctor-quick.service"
    assert stop in verbs and verbs.index(stop) > verbs.index(
        "disable --now mlstack-doctor-fast.timer mlstack-doctor-quick.timer"
    )
    assert not systemd.active


def test_a_unit_systemd_never_loaded_is_removed_all_the_same(tmp_path: Path, systemd: FakeSystemd) -> None:
    spec = schedule.parse_spec(raw_spec(tmp_path))
    schedule.apply(spec, systemd)
    (tmp_path / "units/mlstack-doctor-old.service").write_text("[Service]\n")
    systemd.unloaded.add("mlstack-doctor-old.service")
    done = schedule.remove(spec, systemd)
    assert f"removed {tmp_path / 'units/mlstack-doctor-old.service'}" in done
    assert list((tmp_path / "units").iterdir()) == []
    # Any other failure to stop still fails the removal.
    schedule.apply(spec, systemd)
    systemd.unloaded.clear()

    def refusing(args: Sequence[str]) -> subprocess.CompletedProcess[str]:
        if args[0] == "stop":
            return subprocess.CompletedProcess(args, 1, "", "Access denied")
        return systemd(args)

    with pytest.raises(RuntimeError, match=r"systemctl stop .* failed \(exit 1\): Access denied"):
        schedule.remove(spec, refusing)


def test_the_script_carries_its_settings_quoted(tmp_path: Path) -> None:
    raw = raw_spec(tmp_path, model="/models/it's here", expect_gpu=False, when_busy="yes")
    spec = schedule.parse_spec(raw)
    text = schedule.render_script(spec)
    assert text.startswith("#!/bin/sh\n")
    assert "model='/models/it'\"'\"'s here'" in text
    assert "expect_gpu=no" in text and "when_busy=yes" in text
    assert f"metrics_dir={tmp_path / 'metrics'}" in text
    # The settings are read by the body: sh -n parses the whole script.
    script = tmp_path / "m.sh"
    script.write_text(text)
    r = subprocess.run(["sh", "-n", str(script)], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    r = subprocess.run(["sh", str(script)], capture_output=True, text=True, check=False)
    assert r.returncode == 2 and "usage:" in r.stderr


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (lambda r: r.pop("runs"), "lacks runs"),
        (lambda r: r["runs"][1].update(tier="fast"), "a tier of its own"),
        (lambda r: r["runs"][0].update(tier="Fast; rm"), "lower-case word"),
        (lambda r: r["runs"][0].update(timeout_s=0), "timeout_s must be a whole number >= 1"),
        (lambda r: r["runs"][1].update(calendar="daily\nExecStart=/bin/evil"), "OnCalendar expression"),
        (lambda r: r["settings"].update(colour="red"), "unknown settings: colour"),
    ],
)
def test_a_bad_spec_is_refused_saying_why(tmp_path: Path, change: Any, says: str) -> None:
    raw = raw_spec(tmp_path)
    change(raw)
    with pytest.raises(ValueError, match=says):
        schedule.parse_spec(raw)


def test_the_command_prints_what_changed_and_exits_2_on_a_bad_spec(tmp_path: Path) -> None:
    env_cmd = [sys.executable, "-m", "mlstack_doctor.ops.schedule"]
    env = {"PYTHONPATH": str(SRC), "PATH": "/usr/bin:/bin"}
    bad = subprocess.run([*env_cmd, "apply", "{}"], capture_output=True, text=True, env=env, check=False)
    assert bad.returncode == 2 and "bad spec: the spec lacks script" in bad.stderr
    # remove with nothing scheduled touches no systemd: it runs here as it would in a fresh container.
    remove = [*env_cmd, "remove", json.dumps(raw_spec(tmp_path))]
    r = subprocess.run(remove, capture_output=True, text=True, env=env, check=False)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"changed": False, "actions": []}


@pytest.mark.parametrize(
    ("overrides", "argv"),
    [
        # The container's doctor settings hold the rest: the timers restate nothing.
        ({}, "--tier fast --quiet --output {m}/doctor-fast.json --metrics {m}/doctor.prom"),
        (
            {"model": "27b", "purpose": "inference", "expect_gpu": False},
            "--tier fast --quiet --output {m}/doctor-fast.json --metrics {m}/doctor.prom --model 27b "
            "--purpose inference --no-gpu",
        ),
    ],
    ids=["from the settings", "overridden"],
)
def test_a_scheduled_run_is_the_doctor_command_every_caller_runs(
    tmp_path: Path, overrides: dict[str, Any], argv: str
) -> None:
    venv = tmp_path / "venvs" / "p-1"
    (venv / "bin").mkdir(parents=True)
    doctor = venv / "bin" / "mlstack-doctor"
    doctor.write_text(f'#!/bin/sh\necho "$@" > {tmp_path / "argv"}\n')
    doctor.chmod(0o755)
    (tmp_path / "venv").symlink_to(venv)
    raw = raw_spec(tmp_path)
    raw["settings"] = {"venv": str(tmp_path / "venv"), **overrides}
    script = tmp_path / "monitor"
    script.write_text(schedule.render_script(schedule.parse_spec(raw)))
    r = subprocess.run(["sh", str(script), "fast", "30"], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "argv").read_text().strip() == argv.format(m=tmp_path / "metrics")


def test_a_schedule_names_its_venv_and_a_known_purpose(tmp_path: Path) -> None:
    raw = raw_spec(tmp_path)
    raw["settings"]["purpose"] = "gaming"
    with pytest.raises(ValueError, match="purpose must be one of training, inference"):
        schedule.parse_spec(raw)
    raw["settings"] = {"model": "tiny"}
    with pytest.raises(ValueError, match=r"settings\.venv is required"):
        schedule.parse_spec(raw)
