"""Bad input the specs cannot catch fails in the preflight play, before any change, with a message that
says what to fix (tests/provision/test_bad_input.py has the first cases; these are the rest). Each
case runs provision.yml for real against the testbed and checks nothing was created."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faultlib import GpulessNode, one_line
from playbook_runner import REPO, container
from tbhelpers import ct_exists as exists


def assert_refused_before_any_change(result: Any, api: Any, testbed: Any, message: str, vmid: int) -> None:
    assert result.rc != 0
    assert message in one_line(result.output), result.output[-3000:]
    assert result.changed() == 0, result.changed_tasks()
    assert "PLAY [Prepare the PVE nodes" not in result.output, "got past the preflight play"
    assert not exists(api, testbed.node, vmid)


@pytest.fixture
def outside_link() -> Iterator[str]:
    """/srv/mlstack-faults-model: inside an allowed root by name, a symlink to /etc in fact."""
    link = Path("/srv/mlstack-faults-model")
    link.unlink(missing_ok=True)
    link.symlink_to("/etc")
    yield str(link)
    link.unlink(missing_ok=True)


CASES = {
    "model path outside the allowed roots": (
        {"model_path": "/etc"},
        "model_path /etc is /etc on testbed, outside the folders that may be bind-mounted",
    ),
    "model path with '..' parts": ({"model_path": "/srv/../etc"}, "(no '.' or '..' parts)"),
    "memory below the profile's need": (
        {"memory_mb": 512, "profile": "torch211-triton36"},
        "profile torch211-triton36 needs at least 2048 MiB of memory and 16 GiB of disk",
    ),
    "disk below the profile's need": ({"disk_gb": 4}, "the inventory gives memory_mb 2048 and disk_gb 4"),
}


@pytest.mark.parametrize(("fields", "message"), list(CASES.values()), ids=list(CASES))
def test_bad_input_is_refused_before_any_change(
    runner: Any, api: Any, testbed: Any, fields: dict[str, Any], message: str
) -> None:
    result = runner("provision.yml", [container(171, **fields)], timeout=300)
    assert_refused_before_any_change(result, api, testbed, message, 171)


def test_model_path_symlinked_outside_the_roots_is_refused(
    runner: Any, api: Any, testbed: Any, outside_link: str
) -> None:
    result = runner("provision.yml", [container(172, model_path=outside_link)], timeout=300)
    message = f"model_path {outside_link} is /etc on testbed, outside the folders"
    assert_refused_before_any_change(result, api, testbed, message, 172)


@pytest.fixture
def stale_profiles(tmp_path: Path) -> Path:
    """A copy of the profiles where torch211-triton36's pyproject gained a dependency its lock lacks."""
    profiles = tmp_path / "profiles"
    shutil.copytree(REPO / "profiles", profiles)
    pyproject = profiles / "torch211-triton36" / "pyproject.toml"
    text = pyproject.read_text()
    assert '    "einops",\n' in text
    pyproject.write_text(text.replace('    "einops",\n', '    "einops",\n    "six",\n'))
    return profiles


def test_lock_out_of_date_with_its_pyproject_is_refused(
    runner: Any, api: Any, testbed: Any, stale_profiles: Path
) -> None:
    result = runner(
        "provision.yml",
        [container(173, profile="torch211-triton36")],
        timeout=300,
        gpu_container_profiles_dir=str(stale_profiles),
    )
    message = "Profile torch211-triton36: `uv lock --check` says its uv.lock is out of date with its"
    message += " pyproject.toml"
    assert_refused_before_any_change(result, api, testbed, message, 173)
    assert "uv lock --project profiles/torch211-triton36" in one_line(result.output)


@pytest.fixture
def gpuless_node(testbed: Any, tmp_path: Path) -> Iterator[GpulessNode]:
    node = GpulessNode(Path(testbed.state_dir), tmp_path)
    yield node
    node.close()


def test_gpus_asked_on_a_node_without_gpus_are_refused(
    runner: Any, api: Any, testbed: Any, gpuless_node: GpulessNode
) -> None:
    result = runner("provision.yml", [container(174, gpus="all")], timeout=300, **gpuless_node.extra_vars())
    message = "A container on testbed asks for GPUs but the node has no /dev/nvidia[0-9]* node"
    assert_refused_before_any_change(result, api, testbed, message, 174)
    assert "Install the NVIDIA driver on the node" in one_line(result.output)
