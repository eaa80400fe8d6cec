from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from doctor_testlib import SRC, fake_site, validate, write_lock
from mlstack_doctor import profile as prof
from mlstack_doctor.facts import stack

LOCK_WITH_OVERRIDE = """version = 1
revision = 3
requires-python = ">=3.12"

[manifest]
overrides = [{ name = "triton", specifier = "==3.7.0" }]

[[package]]
name = "torch"
version = "2.11.0+cu130"
source = { registry = "https://download.pytorch.org/whl/cu130" }
dependencies = [
    { name = "triton", marker = "sys_platform == 'linux'" },
]

[[package]]
name = "triton"
version = "3.7.0"
source = { registry = "https://pypi.org/simple" }

[[package]]
name = "Flash_Linear_Attention"
version = "0.5.1"
source = { registry = "https://pypi.org/simple" }
"""


@pytest.mark.parametrize("parser", ["tomllib", "minimal"])
def test_lock_parsing(tmp_path: Path, parser: str) -> None:
    text = LOCK_WITH_OVERRIDE
    packages, overrides = stack.parse_lock(text) if parser == "tomllib" else stack._parse_lock_minimal(text)
    assert packages["torch"] == "2.11.0+cu130" and packages["triton"] == "3.7.0"
    assert packages["flash-linear-attention"] == "0.5.1"
    if parser == "tomllib":
        assert overrides == {"triton": "==3.7.0"}


def test_load_directory_and_default(tmp_path: Path) -> None:
    (tmp_path / "uv.lock").write_text(LOCK_WITH_OVERRIDE)
    p = prof.load(str(tmp_path))
    assert p.expect == {"torch": "2.11.0+cu130", "triton": "3.7.0", "flash-linear-attention": "0.5.1"}
    # `default` is the stack policy's default profile, as shipped (no built-in pins of its own).
    default = prof.load("default")
    assert default.name == "torch211-triton37-fla06"
    assert default.expect["triton"] == "3.7.1" and default.expect["flash-linear-attention"] == "0.6.0"


@pytest.mark.parametrize("spec", ["/nonexistent", "not-a-builtin"])
def test_load_errors(spec: str) -> None:
    with pytest.raises(prof.ProfileError):
        prof.load(spec)


def test_lock_without_stack_packages(tmp_path: Path) -> None:
    lock = write_lock(tmp_path, {"numpy": "2.0.0"})
    with pytest.raises(prof.ProfileError, match="locks none"):
        prof.load(str(lock))


@pytest.mark.parametrize(
    "installed,spec,ok",
    [
        ("2.11.0+cu130", "2.11.*", True),
        ("2.11.0+cu130", "2.11.0", True),
        ("2.11.0+cu130", "2.11.0+cu130", True),
        ("2.11.0+cpu", "2.11.0+cu130", False),
        ("2.13.0+cpu", "2.11.*", False),
        ("3.6.0", "==3.6.0", True),
        ("3.7.0", "3.6.*", False),
        ("5.17.0", "5.*", True),
    ],
)
def test_matches(installed: str, spec: str, ok: bool) -> None:
    assert prof.matches(installed, spec) is ok


@pytest.mark.parametrize(
    "req,pin",
    [
        ('triton==3.6.0; platform_system == "Linux" and platform_machine == "x86_64"', ("triton", "3.6.0")),
        ("nvidia-cublas==13.1.0.3; platform_system == 'Linux'", ("nvidia-cublas", "13.1.0.3")),
        ("sympy>=1.13.3", None),
    ],
)
def test_pin_of(req: str, pin: tuple[str, str] | None) -> None:
    assert prof.pin_of(req) == pin


SHIPPED = sorted(prof.shipped())
ROOT = Path(__file__).resolve().parents[2]


def test_the_doctor_reads_the_shipped_profiles_and_policy_from_profiles() -> None:
    """Run from the checkout, the doctor's shipped profiles are profiles/ itself: its folders, policy.yml's
    default and rules (a wheel carries the same, written by its build)."""
    yaml = pytest.importorskip("yaml")
    policy = yaml.safe_load((ROOT / "profiles" / "policy.yml").read_text())
    data = prof.shipped_data()
    assert (data["default_profile"], data["rules"]) == (policy["default_profile"], policy["rules"])
    assert SHIPPED == stack.list_profiles(str(ROOT / "profiles"))


def test_a_wheel_reads_what_its_build_wrote(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Outside a checkout (no profiles/ beside the sources) the doctor reads shipped_profiles.json."""
    pytest.importorskip("yaml")
    written = prof.shipped_from(ROOT / "profiles")
    package = tmp_path / "mlstack_doctor"
    package.mkdir()
    (package / prof.SHIPPED_FILE).write_text(json.dumps(written))
    monkeypatch.setattr(prof, "CHECKOUT_PROFILES", tmp_path / "profiles")
    monkeypatch.setattr(prof.resources, "files", lambda _: package)
    prof.shipped_data.cache_clear()
    try:
        assert prof.shipped_data() == json.loads(json.dumps(written))
        (package / prof.SHIPPED_FILE).unlink()
        prof.shipped_data.cache_clear()
        with pytest.raises(prof.ProfileError, match=r"carries no shipped_profiles\.json"):
            prof.shipped_data()
    finally:
        prof.shipped_data.cache_clear()


def test_without_pyyaml_a_checkout_names_what_it_cannot_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A checkout's python without PyYAML cannot read policy.yml: a ProfileError that says so, a shipped
    name or `default` cannot load, a uv.lock of its own still does."""
    monkeypatch.setitem(sys.modules, "yaml", None)  # import yaml: ImportError
    prof.shipped_data.cache_clear()
    try:
        with pytest.raises(prof.ProfileError, match="PyYAML"):
            prof.shipped_data()
        for name in (prof.DEFAULT, SHIPPED[0]):
            with pytest.raises(prof.ProfileError, match="shipped profiles cannot be read"):
                prof.load(name)
        lock = write_lock(tmp_path / "own", {"torch": "2.11.0", "triton": "3.7.1"})
        assert prof.load(str(lock.parent)).expect == {"torch": "2.11.0", "triton": "3.7.1"}
    finally:
        prof.shipped_data.cache_clear()


def test_the_doctor_from_a_checkout_runs_without_pyyaml(tmp_path: Path) -> None:
    """A bare python (a venv of its own: no PyYAML) runs the doctor from the checkout: --help works, the
    shipped match and the stack policy are reported not read (a warning, no code), torch's triton pin
    overridden is not blamed on a profile it could not read, and a shipped profile's name cannot run."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    assert subprocess.run([python, "-c", "import yaml"], capture_output=True).returncode != 0
    site = fake_site(
        tmp_path,
        {
            "torch": ("2.11.0+cu130", ['triton==3.6.0; platform_system == "Linux"']),
            "triton": ("3.7.1", []),
            "flash-linear-attention": ("0.6.0", ["fla-core==0.6.0"]),
            "fla-core": ("0.6.0", []),
            "transformers": ("5.17.0", []),
        },
    )
    env = dict(
        os.environ,
        PYTHONPATH=f"{site}{os.pathsep}{SRC}",
        TRITON_CACHE_DIR=str(tmp_path / "cache"),
        MLSTACK_DOCTOR_SETTINGS="",
    )

    def doctor(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [python, "-m", "mlstack_doctor", *args]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)

    helped = doctor("--help")
    assert helped.returncode == 0 and "PyYAML" in helped.stdout, helped.stderr
    run = doctor(
        "--tier", "fast", "--no-gpu", "--json", "--quiet", "--only", "package_versions,torch_triton_pin"
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout)
    validate(report)
    probes = {p["name"]: p for p in report["probes"]}
    versions, pin = probes["package_versions"], probes["torch_triton_pin"]
    assert (versions["status"], versions.get("code")) == ("warn", None) and "PyYAML" in versions["summary"]
    assert versions["evidence"]["matches_shipped"] is None
    assert (
        versions["evidence"]["policy"]["rules"] == []
        and "PyYAML" in versions["evidence"]["policy"]["not_evaluated"]
    )
    assert (pin["status"], pin.get("code")) == ("warn", None) and "is not known" in pin["summary"], pin
    named = doctor("--tier", "fast", "--no-gpu", "--json", "--quiet", "--profile", prof.DEFAULT)
    assert named.returncode == 2 and "PyYAML" in named.stderr, named.stderr


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_profile_loads_by_name_and_its_stack_matches_it_alone(name: str) -> None:
    p = prof.load(name)
    assert p.name == name and p.pinned and set(p.expect) == set(prof.STACK)
    installed = {d: v + ("+cu130" if d == "torch" else "") for d, v in p.expect.items()}
    assert prof.matching_shipped(installed) == [name]


def test_no_profile_pins_nothing_but_needs_the_stack() -> None:
    p = prof.load(None)
    assert not p.pinned and set(p.expect) == set(prof.STACK)
    assert all(prof.matches("0.0.1", spec) for spec in p.expect.values())


@pytest.mark.parametrize(
    "installed",
    [
        {"torch": "2.11.0", "triton": "3.7.1", "flash-linear-attention": "0.6.0", "fla-core": "0.6.0"},
        {
            "torch": "2.0.0",
            "triton": "3.7.1",
            "flash-linear-attention": "0.6.0",
            "fla-core": "0.6.0",
            "transformers": "5.17.0",
        },
    ],
    ids=["transformers missing", "another torch"],
)
def test_a_stack_matches_no_shipped_profile_unless_every_version_is_its(installed: dict[str, str]) -> None:
    assert prof.matching_shipped(dict(installed)) == []


@pytest.mark.parametrize(
    "fla,core,requires,unpaired",
    [
        ("0.6.0", "0.6.0", ["fla-core==0.6.0", "einops"], None),
        ("0.6.0", "0.5.1", ["fla-core==0.6.0"], "fla-core==0.6.0"),
        ("0.6.0", None, ["fla-core==0.6.0"], "fla-core==0.6.0"),
        ("0.4.0", "0.5.1", ["einops"], None),  # before fla-core was split out: nothing to pair
        (None, "0.5.1", [], None),
    ],
)
def test_fla_pairs_with_the_fla_core_it_pins(
    fla: str | None, core: str | None, requires: list[str], unpaired: str | None
) -> None:
    found = prof.unpaired_fla({"flash-linear-attention": fla, "fla-core": core}, requires)
    assert (found or {}).get("pins") == unpaired


def test_an_override_is_declared_by_the_profile_checked_or_the_shipped_profile_matched() -> None:
    assert prof.declared_override(None, [], "triton", "3.7.1") is None
    assert prof.declared_override(prof.unpinned(), ["torch211-triton37-fla06"], "triton", "3.7.1").name == (
        "torch211-triton37-fla06"
    )
    # A profile that pins another triton declares nothing, whatever the stack matches.
    assert (
        prof.declared_override(prof.load("torch211-triton36"), ["torch211-triton37"], "triton", "3.7.1")
        is None
    )
