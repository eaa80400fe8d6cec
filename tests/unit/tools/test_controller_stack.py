"""tools/controller_stack.py: which Ansible `make venv` installs on which Python (ansible-core 2.21 from
Python 3.12 on, 2.19 on 3.11), the CONTROLLER_STACK override and its refusal, the stack beside a venv; and
the Makefile following it (the venv remade when the stack changes)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "tools"))

import controller_stack as cs  # noqa: E402

CORE219 = ("core219", "requirements-controller.txt", "requirements-controller.lock")
CORE221 = ("core221", "requirements-controller-core221.txt", "requirements-controller-core221.lock")
HERE = sys.version_info[:2]


def files(stack: cs.Stack) -> tuple[str, str, str]:
    return stack.name, stack.requirements, stack.lock


@pytest.mark.parametrize(
    ("version", "expected"),
    [((3, 11), CORE219), ((3, 12), CORE221), ((3, 13), CORE221), ((3, 14), CORE221)],
)
def test_the_default_follows_the_python(version: tuple[int, int], expected: tuple[str, str, str]) -> None:
    assert files(cs.choose(version)) == expected
    assert files(cs.choose(version, "")) == expected  # `make venv` with CONTROLLER_STACK unset


@pytest.mark.parametrize(
    ("version", "requested", "expected"),
    [((3, 13), "core219", CORE219), ((3, 12), "core219", CORE219), ((3, 12), "core221", CORE221)],
)
def test_a_stack_asked_for_is_the_one(
    version: tuple[int, int], requested: str, expected: tuple[str, str, str]
) -> None:
    assert files(cs.choose(version, requested)) == expected


def test_core221_on_python_3_11_is_refused_with_the_way_out() -> None:
    with pytest.raises(cs.StackError) as e:
        cs.choose((3, 11), "core221")
    text = str(e.value)
    for said in (
        "CONTROLLER_STACK=core221",
        "needs Python >= 3.12",
        "this python3 is 3.11",
        "CONTROLLER_STACK=core219",
    ):
        assert said in text, text
    assert "May 2027" in text, "the fallback's end of life is stated"


@pytest.mark.parametrize(("version", "requested"), [((3, 13), "core220"), ((3, 10), None)])
def test_no_stack_is_refused(version: tuple[int, int], requested: str | None) -> None:
    with pytest.raises(cs.StackError):
        cs.choose(version, requested)


def test_the_files_each_stack_names_exist_and_pin_its_ansible_core() -> None:
    for stack, core in (("core219", "2.19."), ("core221", "2.21.")):
        s = cs.by_name(stack)
        assert f"ansible-core=={core}" in (REPO / s.requirements).read_text()
        assert f"ansible-core=={core}" in (REPO / s.lock).read_text()


def test_the_execution_environment_is_on_the_newest_stack() -> None:
    assert cs.EXECUTION_ENVIRONMENT == cs.STACKS[-1].name


@pytest.mark.parametrize(
    ("stamp", "expected"), [("core221\n", "core221"), ("core219\n", "core219"), ("", "core219")]
)
def test_a_venv_holds_the_stack_its_stamp_names(tmp_path: Path, stamp: str, expected: str) -> None:
    (tmp_path / ".done").write_text(stamp)  # empty: made before the stamp named its stack
    assert cs.installed(tmp_path, (3, 13)).name == expected
    assert cs.other(cs.installed(tmp_path, (3, 13))).name != expected


@pytest.mark.parametrize(("version", "expected"), [((3, 11), "core219"), ((3, 13), "core221")])
def test_no_venv_holds_the_default(tmp_path: Path, version: tuple[int, int], expected: str) -> None:
    assert cs.installed(tmp_path / "none", version).name == expected


def script(*args: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, str(REPO / "tools/controller_stack.py"), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)


def test_the_script_prints_this_pythons_stack() -> None:
    r = script()
    assert r.returncode == 0 and r.stdout.split() == list(files(cs.choose(HERE))), r


def test_the_script_refuses_with_the_reason() -> None:
    r = script("core220")
    assert r.returncode == 2 and not r.stdout
    assert "CONTROLLER_STACK=core220 is no controller stack" in r.stderr


def test_the_script_names_the_stack_beside_a_venv(tmp_path: Path) -> None:
    (tmp_path / ".done").write_text("core219\n")
    assert script("--beside", str(tmp_path)).stdout.split() == list(CORE221)


def make(venv: Path, *args: str) -> subprocess.CompletedProcess[str]:
    argv = ["make", "--no-print-directory", "-n", "venv", f"VENV={venv}", f"PYTHON3={sys.executable}", *args]
    return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=60, check=False)


def made(venv: Path, stack: cs.Stack) -> None:
    """A venv as `make venv` leaves it, stamped after its inputs."""
    venv.mkdir()
    (venv / ".done").write_text(stack.name + "\n")


def test_make_venv_installs_the_chosen_stacks_files(tmp_path: Path) -> None:
    stack = cs.choose(HERE)
    out = make(tmp_path / "venv").stdout
    assert f"tools/venv-install {tmp_path / 'venv'} {stack.requirements} {stack.lock} -e ./verify" in out, out
    assert f"echo {stack.name} >{tmp_path / 'venv'}/.done" in out, out
    assert "rm -rf" not in out


def test_make_venv_with_its_stack_in_place_does_nothing(tmp_path: Path) -> None:
    made(tmp_path / "venv", cs.choose(HERE))
    assert "Nothing to be done" in make(tmp_path / "venv").stdout


def test_another_stack_remakes_the_venv_from_nothing(tmp_path: Path) -> None:
    here = cs.choose(HERE)
    made(tmp_path / "venv", cs.other(here))
    out = make(tmp_path / "venv").stdout
    assert f"rm -rf {tmp_path / 'venv'}" in out, out
    assert f"{here.requirements} {here.lock}" in out, out


def test_make_venv_refuses_a_stack_this_python_cannot_run(tmp_path: Path) -> None:
    # Not -n: the recipe's first line asks tools/controller_stack.py, which refuses before anything is made.
    argv = ["make", "--no-print-directory", "venv", f"VENV={tmp_path / 'venv'}", f"PYTHON3={sys.executable}"]
    r = subprocess.run(
        [*argv, "CONTROLLER_STACK=core220"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False
    )
    assert r.returncode != 0
    assert "CONTROLLER_STACK=core220 is no controller stack" in r.stderr
    assert not (tmp_path / "venv").exists()
