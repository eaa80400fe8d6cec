"""The doctor's settings file (mlstack_doctor.settings) and the defaults the CLI takes from it: inside a
provisioned container `mlstack-doctor` with no arguments checks that container's lock, model, purpose and
caches; flags given still win; a file that cannot be used stops the doctor (exit 2) naming what to fix.
Without a file and without --profile the doctor checks no pins of ours: green on each shipped profile's
stack, red only on a known-bad combination. Real doctor runs (fast tier) over dist-info metadata."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from doctor_testlib import SRC, fake_site, validate, write_lock
from mlstack_doctor import profile as prof
from mlstack_doctor import settings

TORCH_REQUIRES = ['triton==3.6.0; platform_system == "Linux"']  # torch 2.11.0's own pin


def shipped_stack(name: str) -> dict[str, tuple[str, list[str]]]:
    """A shipped profile's locked versions as installed packages (torch with its CUDA tag and triton pin,
    flash-linear-attention pinning its fla-core)."""
    expect = prof.load(name).expect
    return {
        "torch": (expect["torch"] + "+cu130", TORCH_REQUIRES),
        "triton": (expect["triton"], []),
        "flash-linear-attention": (expect["flash-linear-attention"], [f"fla-core=={expect['fla-core']}"]),
        "fla-core": (expect["fla-core"], []),
        "transformers": (expect["transformers"], []),
    }


def doctor(
    tmp_path: Path, stack: dict[str, tuple[str, list[str]]], *args: str, settings_file: str = ""
) -> tuple[int, dict, str]:
    site = fake_site(tmp_path, stack)
    env = dict(
        os.environ,
        PYTHONPATH=f"{site}{os.pathsep}{SRC}",
        TRITON_CACHE_DIR=str(tmp_path / "cache"),
        MLSTACK_DOCTOR_SETTINGS=settings_file,
    )
    out = tmp_path / "report.json"
    proc = subprocess.run(
        [sys.executable, "-m", "mlstack_doctor", "--tier", "fast", "--quiet", "--output", str(out), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    report = json.loads(out.read_text()) if out.is_file() else {}
    if report:
        validate(report)
    return proc.returncode, report, proc.stderr


def probe(report: dict, name: str) -> dict:
    return next(p for p in report["probes"] if p["name"] == name)


def write_settings(tmp_path: Path, **values: object) -> str:
    path = tmp_path / "doctor.json"
    path.write_text(json.dumps(values))
    return str(path)


# --- the parser


def test_a_full_settings_file_parses() -> None:
    text = json.dumps(
        {
            "venv": "/opt/mlstack/venv",
            "lock": "/opt/mlstack/venv/uv.lock",
            "model": "tiny",
            "purpose": "inference",
            "expect_gpu": False,
            "triton_cache_root": "/var/cache/mlstack/triton",
        }
    )
    s = settings.parse(text, "/etc/mlstack/doctor.json")
    assert s.purpose == "inference" and s.expect_gpu is False and s.model == "tiny"
    assert s.to_json()["lock"] == "/opt/mlstack/venv/uv.lock"


@pytest.mark.parametrize(
    "text,says",
    [
        ("{not json", "is not JSON"),
        ("[1]", "must hold one JSON object"),
        ('{"purpose": "gaming"}', "purpose must be one of training, inference"),
        ('{"expect_gpu": "yes"}', "expect_gpu must be a JSON bool"),
        ('{"lock": "uv.lock"}', "lock must be an absolute path"),
        ('{"colour": "red"}', "unknown keys colour"),
        ('{"model": ""}', "model must be tiny, 27b or a path"),
    ],
)
def test_a_bad_settings_file_says_what_to_fix(text: str, says: str) -> None:
    with pytest.raises(settings.SettingsError, match=says) as err:
        settings.parse(text, "/etc/mlstack/doctor.json")
    assert "/etc/mlstack/doctor.json" in str(err.value)


def test_the_lock_is_the_running_venvs_own_where_it_holds_one(tmp_path: Path) -> None:
    s = settings.Settings(source="f", lock="/opt/mlstack/venv/uv.lock")
    assert s.lock_for(str(tmp_path)) == "/opt/mlstack/venv/uv.lock"
    (tmp_path / "uv.lock").write_text("")
    assert s.lock_for(str(tmp_path)) == str(tmp_path / "uv.lock")


def test_settings_check_validates_a_file_as_the_role_writes_it(tmp_path: Path) -> None:
    good = write_settings(tmp_path, purpose="training", expect_gpu=True)
    assert settings.main(["check", good]) == 0
    (tmp_path / "bad.json").write_text('{"purpose": "both"}')
    assert settings.main(["check", str(tmp_path / "bad.json")]) == 2


# --- the CLI's defaults


def test_a_bad_settings_file_stops_the_doctor_with_exit_2(tmp_path: Path) -> None:
    bad = write_settings(tmp_path, purpose="both")
    rc, report, err = doctor(tmp_path, shipped_stack("default"), "--no-gpu", settings_file=bad)
    assert rc == 2 and not report
    assert f"cannot run: {bad}: purpose must be one of training, inference" in err


def test_the_settings_give_the_defaults(tmp_path: Path) -> None:
    lock = write_lock(tmp_path / "venv", {"torch": "2.11.0", "triton": "3.6.0"})
    path = write_settings(
        tmp_path,
        lock=str(lock),
        model="27b",
        purpose="inference",
        expect_gpu=False,
        triton_cache_root=str(tmp_path / "triton"),
    )
    rc, report, _ = doctor(tmp_path, shipped_stack("torch211-triton37-fla06"), settings_file=path)
    opts = report["options"]
    assert opts["settings"] == path and opts["profile"] == str(lock)
    assert opts["purpose"] == "inference" and opts["model"] == "27b" and opts["expect_gpu"] is False
    venv_name = os.path.basename(os.path.realpath(sys.prefix))
    assert opts["triton_cache_dir"] == str(tmp_path / "triton" / venv_name)
    # The settings' lock is checked: triton 3.7.1 installed, 3.6.0 locked.
    versions = probe(report, "package_versions")
    assert rc == 1 and versions["code"] == "VERSION_OFF_PROFILE", versions
    assert versions["evidence"]["profile"]["source"] == str(lock)


def test_flags_given_win_over_the_settings(tmp_path: Path) -> None:
    lock = write_lock(tmp_path / "venv", {"torch": "2.11.0", "triton": "3.6.0"})
    path = write_settings(tmp_path, lock=str(lock), model="27b", purpose="inference", expect_gpu=False)
    _, report, _ = doctor(
        tmp_path,
        shipped_stack("torch211-triton37-fla06"),
        "--profile",
        "torch211-triton37-fla06",
        "--purpose",
        "training",
        "--model",
        "tiny",
        settings_file=path,
    )
    opts = report["options"]
    assert opts["profile"] == "torch211-triton37-fla06" and opts["purpose"] == "training"
    assert opts["model"] == "tiny" and opts["expect_gpu"] is False  # not given: from the settings
    assert probe(report, "package_versions")["status"] == "pass"


# --- no settings, no --profile: no pins of ours


@pytest.mark.parametrize("name", sorted(prof.shipped()))
def test_without_a_profile_each_shipped_stack_is_green_and_named(tmp_path: Path, name: str) -> None:
    rc, report, err = doctor(tmp_path, shipped_stack(name), "--no-gpu")
    versions, pin = probe(report, "package_versions"), probe(report, "torch_triton_pin")
    assert rc == 0, (err, report["summary"])
    assert versions["status"] == "pass" and versions["evidence"]["matches_shipped"] == [name], versions
    assert f"the stack is shipped profile {name}" in versions["summary"]
    assert versions["evidence"]["profile"]["name"] == "none" and report["options"]["settings"] is None
    assert pin["status"] == "pass", pin  # triton 3.7.1: the shipped profile declares the override


def test_without_a_profile_another_stack_is_green_and_matches_nothing(tmp_path: Path) -> None:
    stack = {**shipped_stack("default"), "torch": ("2.13.0", []), "transformers": ("5.18.0", [])}
    rc, report, _ = doctor(tmp_path, stack, "--no-gpu")
    versions = probe(report, "package_versions")
    assert rc == 0 and versions["status"] == "pass" and versions["evidence"]["matches_shipped"] == []
    assert "no shipped profile matches" in versions["summary"]


def test_without_a_profile_an_unpaired_fla_core_is_red(tmp_path: Path) -> None:
    stack = {**shipped_stack("default"), "fla-core": ("0.5.1", [])}
    rc, report, _ = doctor(tmp_path, stack, "--no-gpu")
    versions = probe(report, "package_versions")
    assert rc == 1 and versions["code"] == "FLA_CORE_UNPAIRED", versions
    assert "'fla-core==0.6.0'" in versions["fix"]
    assert report["summary"]["root_cause"]["code"] == "FLA_CORE_UNPAIRED"


def test_without_a_profile_a_missing_stack_package_is_red(tmp_path: Path) -> None:
    stack = {k: v for k, v in shipped_stack("default").items() if k != "transformers"}
    rc, report, _ = doctor(tmp_path, stack, "--no-gpu")
    versions = probe(report, "package_versions")
    assert rc == 1 and versions["code"] == "PACKAGE_MISSING" and "install 'transformers'" in versions["fix"]


def test_an_unknown_profile_name_lists_the_shipped_ones(tmp_path: Path) -> None:
    rc, _, err = doctor(tmp_path, shipped_stack("default"), "--no-gpu", "--profile", "torch299")
    assert rc == 2 and "torch211-triton37-fla06" in err and "not a shipped profile" in err


def test_a_venvs_own_lock_is_read_only_through_the_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Inside a provisioned venv (its uv.lock beside bin/): with the settings, that lock; without them
    (MLSTACK_DOCTOR_SETTINGS=, or no file), no pins of ours."""
    from mlstack_doctor import cli

    (tmp_path / "uv.lock").write_text("")
    monkeypatch.setattr(sys, "prefix", str(tmp_path))
    args = cli.build_parser().parse_args(["--no-gpu"])
    assert cli.with_defaults(args, None).profile is None
    found = settings.Settings(source="/etc/mlstack/doctor.json", lock="/opt/mlstack/venv/uv.lock")
    assert cli.with_defaults(args, found).profile == str(tmp_path / "uv.lock")
    assert cli.with_defaults(args, found).settings == "/etc/mlstack/doctor.json"


def test_without_fla_installed_the_pairing_check_says_it_is_missing(tmp_path: Path) -> None:
    stack = {
        k: v for k, v in shipped_stack("default").items() if k not in ("flash-linear-attention", "fla-core")
    }
    rc, report, err = doctor(tmp_path, stack, "--no-gpu")
    versions = probe(report, "package_versions")
    assert rc == 1 and versions["code"] == "PACKAGE_MISSING", (err[-2000:], versions)
