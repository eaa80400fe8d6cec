"""The driver userspace check: a container's libcuda against its node's kernel module, the fleet report's
list of mismatches, and the drift view seeing a driver upgrade where the doctor ran with --no-gpu."""

from __future__ import annotations

from typing import Any

import pytest
from ansible_collections.mlstack.pve.plugins.module_utils.driver_userspace import driver_userspace
from ansible_collections.mlstack.pve.plugins.module_utils.fleet import drift, seen_stack, userspace_mismatches

OLD, NEW = "550.54.14", "560.35.03"
MISMATCH_SAID = f'libcuda {OLD} inside, the node\'s kernel module is {NEW}: CUDA fails with "API mismatch"'


@pytest.mark.parametrize(
    ("libcuda", "node", "status", "said"),
    [
        (NEW, NEW, "match", f"libcuda {NEW} matches the node's kernel module"),
        (
            OLD,
            NEW,
            "mismatch",
            f'libcuda {OLD} inside, the node\'s kernel module is {NEW}: CUDA fails with "API mismatch"',
        ),
        ("", NEW, "mismatch", f"no libcuda inside, the node's kernel module is {NEW}: CUDA cannot start"),
        (None, NEW, "mismatch", f"no libcuda inside, the node's kernel module is {NEW}: CUDA cannot start"),
        (OLD, "", "no_driver", "the node has no NVIDIA driver loaded: not compared"),
        (OLD, None, "no_driver", "the node has no NVIDIA driver loaded: not compared"),
        (f"{NEW}\n", f" {NEW}", "match", f"libcuda {NEW} matches the node's kernel module"),
    ],
    ids=[
        "match",
        "upgraded-node",
        "no-libcuda-empty",
        "no-libcuda-null",
        "no-driver-empty",
        "no-driver-null",
        "stray-whitespace",
    ],
)
def test_driver_userspace_compares_libcuda_with_the_node(
    libcuda: str | None, node: str | None, status: str, said: str
) -> None:
    check = driver_userspace(libcuda, node)
    assert (check["status"], check["summary"]) == (status, said)
    assert (check["fix"] is None) == (status != "mismatch")


@pytest.mark.parametrize(
    ("method", "source", "fix"),
    [
        (
            "runfile",
            "/srv/nvidia",
            f"rerun provision.yml: it installs NVIDIA-Linux-x86_64-{NEW}.run from /srv/nvidia "
            "without its kernel module",
        ),
        (
            "runfile",
            "",
            f"rerun provision.yml: it installs NVIDIA-Linux-x86_64-{NEW}.run without its kernel module",
        ),
        (
            "bind",
            "/usr/local/nvidia/lib64",
            f"make the node's driver library folder (/usr/local/nvidia/lib64) hold its {NEW} libraries, "
            "then rerun provision.yml (it rebuilds the linker cache inside)",
        ),
        (
            "none",
            "",
            "the template's driver libraries are not the node's: set mlstack_nvidia_userspace_method "
            f"to runfile or bind, then rerun provision.yml (it installs {NEW})",
        ),
    ],
)
def test_the_fix_is_the_methods_way_back_to_the_node(method: str, source: str, fix: str) -> None:
    check = driver_userspace(OLD, NEW, method, source)
    assert check == {
        "node": NEW,
        "libcuda": OLD,
        "method": method,
        "status": "mismatch",
        "summary": MISMATCH_SAID,
        "fix": fix,
    }


def _row(name: str, vmid: int, check: dict[str, Any] | None) -> dict[str, Any]:
    return {"container": name, "vmid": vmid, "node": "n", "driver_userspace": check}


def test_userspace_mismatches_names_every_mismatched_container_in_order() -> None:
    rows = [
        _row("n-ct1", 1, driver_userspace(OLD, NEW)),
        _row("n-ct2", 2, driver_userspace(NEW, NEW)),
        _row("n-ct3", 3, None),  # not checked (not reached)
        _row("n-ct4", 4, driver_userspace("", NEW, "bind", "/opt/nv")),
        _row("n-ct5", 5, driver_userspace(OLD, "")),
    ]
    found = userspace_mismatches(rows)
    assert [(m["container"], m["vmid"], m["driver"], m["libcuda"]) for m in found] == [
        ("n-ct1", 1, NEW, OLD),
        ("n-ct4", 4, NEW, None),
    ]
    assert found[0]["fix"].startswith("rerun provision.yml") and found[0]["node"] == "n"
    assert userspace_mismatches([_row("n-ct2", 2, driver_userspace(NEW, NEW))]) == []


def _no_gpu_report() -> dict[str, Any]:
    """A doctor report of a --no-gpu run: the driver probe skipped, so it saw no driver or libcuda."""
    return {
        "probes": [
            {
                "name": "package_versions",
                "stage": "packages",
                "status": "pass",
                "evidence": {"installed": {"torch": "2.11.0"}},
            },
            {"name": "nvidia_driver", "stage": "host", "status": "skip", "evidence": {}},
        ]
    }


def test_seen_stack_takes_the_checks_reading_where_the_doctor_saw_no_driver() -> None:
    check = driver_userspace(OLD, NEW)
    assert seen_stack(_no_gpu_report(), check) == {"torch": "2.11.0", "driver": NEW, "libcuda": OLD}
    assert seen_stack(_no_gpu_report(), driver_userspace(OLD, "")) == {"torch": "2.11.0", "libcuda": OLD}
    assert seen_stack(None, check) == {"driver": NEW, "libcuda": OLD}
    # The doctor's own reading wins where it has one (on a GPU node it reads the same module).
    gpu_report = _no_gpu_report()
    gpu_report["probes"][1] = {
        "name": "nvidia_driver",
        "stage": "host",
        "status": "fail",
        "evidence": {"kernel_module": "570.1", "libcuda_version": "570.0"},
    }
    assert seen_stack(gpu_report, check) == {"torch": "2.11.0", "driver": "570.1", "libcuda": "570.0"}


def test_the_drift_view_shows_a_driver_upgrade_and_then_the_repair() -> None:
    def row(check: dict[str, Any]) -> dict[str, Any]:
        return {
            "container": "n-ct130",
            "profile": "p",
            "reached_doctor": True,
            "seen": seen_stack(_no_gpu_report(), check),
            "stages": {"host": "pass"},
            "root_cause": None,
        }

    provisioned = {"generated": "t0", "containers": [row(driver_userspace(OLD, OLD))]}
    upgraded = row(driver_userspace(OLD, NEW))
    assert drift([upgraded], provisioned)["containers"] == {"n-ct130": [f"driver: {OLD} -> {NEW}"]}
    repaired = row(driver_userspace(NEW, NEW))
    assert drift([repaired], {"generated": "t1", "containers": [upgraded]})["containers"] == {
        "n-ct130": [f"libcuda: {OLD} -> {NEW}"]
    }
