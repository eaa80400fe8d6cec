from __future__ import annotations

from pathlib import Path

import pytest
from doctor_testlib import write_lock
from mlstack_doctor import profile as prof

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
    packages, overrides = prof._parse_lock(text) if parser == "tomllib" else prof._parse_lock_minimal(text)
    assert packages["torch"] == "2.11.0+cu130" and packages["triton"] == "3.7.0"
    assert packages["flash-linear-attention"] == "0.5.1"
    if parser == "tomllib":
        assert overrides == {"triton": "==3.7.0"}


def test_load_directory_and_default(tmp_path: Path) -> None:
    (tmp_path / "uv.lock").write_text(LOCK_WITH_OVERRIDE)
    p = prof.load(str(tmp_path))
    assert p.expect == {"torch": "2.11.0+cu130", "triton": "3.7.0", "flash-linear-attention": "0.5.1"}
    assert prof.load("default").expect["torch"] == "2.11.*"


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
