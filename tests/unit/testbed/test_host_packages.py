"""What the suites need from the machine is in the one list `make test` and `make provision` install from
(mlstack_testbed.node.host_setup: PACKAGES, which `testbed up` installs, and TEST_PACKAGES, which
`make test` adds): not only present on this machine. Each need names the file the tests use and the
Debian package that ships it; where the file is here, dpkg says which package that is."""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

import pytest
from mlstack_testbed.node import host_setup

# Debian's python3 (the one `make venv` makes .venv from on a fresh machine), whose headers python3-dev ships.
DEBIAN_PYTHON = subprocess.run(
    ["/usr/bin/python3", "-c", "import sys; print(f'{sys.version_info[0]}.{sys.version_info[1]}')"],
    capture_output=True,
    text=True,
    check=False,
).stdout.strip()
# (what, the file the tests use, the package that ships it on Debian 12 and 13, who needs it)
NEEDS = [
    ("gcc", "/usr/bin/gcc", "gcc", "test_driver_upgrade, test_nvdriver, test_ct_state, test_verdict_rules"),
    ("libc headers", "/usr/include/stdio.h", "libc6-dev", "every compile of the tests and the doctor's"),
    (
        "Python.h",
        f"/usr/include/python{DEBIAN_PYTHON}/Python.h",
        "python3-dev",
        "test_doctor_real, the fault matrix's two_failures",
    ),
    ("promtool", "/usr/bin/promtool", "prometheus", "test_alert_rules, test_metrics, test_node_metrics"),
    ("lxc-start", "/usr/bin/lxc-start", "lxc", "the testbed's containers"),
]
INSTALLED = host_setup.PACKAGES + host_setup.TEST_PACKAGES


def dpkg(*args: str) -> str:
    return subprocess.run(["dpkg-query", *args], capture_output=True, text=True, check=False).stdout


def names(field: str) -> list[str]:
    """Package names of a Depends or Provides field (versions, architectures and alternatives read)."""
    return [d.split("(")[0].split(":")[0].strip() for d in field.replace("|", ",").split(",") if d.strip()]


@functools.cache
def graph() -> dict[str, set[str]]:
    """Every installed package -> what installing it brings next: its dependencies (every alternative);
    a virtual package -> its providers. One dpkg-query."""
    edges: dict[str, set[str]] = {}
    for line in dpkg("-W", "-f", "${Package}\t${Depends}, ${Pre-Depends}\t${Provides}\n").splitlines():
        name, depends, provides = [*line.split("\t"), "", ""][:3]
        edges.setdefault(name, set()).update(names(depends))
        for virtual in names(provides):
            edges.setdefault(virtual, set()).add(name)
    return edges


def closure(packages: tuple[str, ...]) -> set[str]:
    """The packages and everything they bring, as installed here."""
    seen: set[str] = set()
    todo = list(packages)
    while todo:
        if (name := todo.pop()) not in seen:
            seen.add(name)
            todo += graph().get(name, ())
    return seen


@pytest.mark.parametrize(("what", "path", "package", "who"), NEEDS, ids=[n[0] for n in NEEDS])
def test_a_need_of_the_suites_is_in_the_install_list(what: str, path: str, package: str, who: str) -> None:
    assert package in closure(INSTALLED), f"{what} ({who}): {package} is not installed by host_setup"
    if Path(path).exists():
        owner = dpkg("-S", path).split(":", 1)[0]
        assert owner in closure((package,)), f"{path} is {owner}'s here, not {package}'s"


def test_make_test_and_make_provision_install_the_list() -> None:
    """`make test` installs both lists before its steps (the unit tests start beside `testbed up`);
    `make provision` brings the testbed up, which installs PACKAGES."""
    makefile = (Path(__file__).resolve().parents[3] / "Makefile").read_text()
    assert "\ntest: venv host-packages\n" in makefile and "\nprovision: testbed\n" in makefile
    assert "\nhost-packages: venv\n\ttestbed/testbed packages --tests\n" in makefile
    assert "\ntestbed: venv\n\ttestbed/testbed up " in makefile
