"""mlstack.pve.node_state: the node's state as pve_host acts on it - the PVE version, the driver, the
device nodes, the GPUs, the template listing, directories and resolved paths - on real files, with the
node's commands (pveversion, nvidia-smi, pveam) answered as the real ones answer."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest
from ansible_collections.mlstack.pve.plugins.module_utils import node_state
from localplay import run_module

ROOT = Path(__file__).resolve().parents[4]
PVEVERSION = "pve-manager/8.4.1/2a5fa54a8503f96d (running kernel: 6.8.12-10-pve)\n"
DRIVER = (
    "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.133.20  Release Build  (dvs-builder@U16)\n"
    "GCC version:  gcc version 12.2.0 (Debian 12.2.0-14)\n"
)
SMI = "0, NVIDIA H200, GPU-1a2b, 9.0\n1, NVIDIA H200, GPU-3c4d, 9.0\n"
PVEAM_LIST = (
    f"{'NAME':<60} SIZE\n"
    "local:vztmpl/debian-12-standard_12.12-1_amd64.tar.zst              120.29MB\n"
    "local:vztmpl/debian-12-testbed_amd64.tar.zst                        98.10MB\n"
)


def commands(answers: dict[str, tuple[int, str, str]]) -> Callable[[list[str]], tuple[int, str, str]]:
    """A runner answering by command name; a name it does not know is not installed (127)."""

    def run(argv: list[str]) -> tuple[int, str, str]:
        return answers.get(argv[0], (127, "", f"{argv[0]}: not found"))

    return run


@pytest.mark.parametrize(
    ("answer", "version"),
    [((0, PVEVERSION, ""), "8.4.1"), ((0, "pve-manager/9.0.3/abc\n", ""), "9.0.3")],
)
def test_pve_version(answer: tuple[int, str, str], version: str) -> None:
    assert node_state.pve_version(commands({"pveversion": answer})) == version


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        ((2, "", "pveversion: cannot read"), "exited 2: pveversion: cannot read"),
        ((0, "hello\n", ""), "no pve-manager"),
    ],
)
def test_pve_version_fails_with_what_it_said(answer: tuple[int, str, str], said: str) -> None:
    with pytest.raises(ValueError, match=said):
        node_state.pve_version(commands({"pveversion": answer}))


@pytest.mark.parametrize(
    ("text", "version"),
    [
        (DRIVER, "570.133.20"),
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.14  Thu Feb 22 01:44:30 UTC 2024\n",
            "550.54.14",
        ),
        ("something else\n", ""),
    ],
)
def test_driver_version(tmp_path: Path, text: str, version: str) -> None:
    (tmp_path / "version").write_text(text)
    assert node_state.driver_version(str(tmp_path / "version")) == version


def test_no_driver_loaded_is_an_empty_version(tmp_path: Path) -> None:
    assert node_state.driver_version(str(tmp_path / "missing")) == ""


def test_device_nodes_are_the_nvidia_nodes_without_the_caps_folder(tmp_path: Path) -> None:
    for name in ("nvidia0", "nvidia1", "nvidiactl", "nvidia-uvm", "null", "nvidia-caps/nvidia-cap1"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("")
    assert node_state.device_nodes(str(tmp_path)) == [
        str(tmp_path / n)
        for n in ("nvidia-caps/nvidia-cap1", "nvidia-uvm", "nvidia0", "nvidia1", "nvidiactl")
    ]


@pytest.mark.parametrize(
    ("answer", "count", "reason"),
    [
        ((0, SMI, ""), 2, ""),
        ((127, "", "nvidia-smi: not found"), 0, "nvidia-smi is not installed"),
        (
            (9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\nMore\n", ""),
            0,
            "nvidia-smi exited 9: NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA"
            " driver.",
        ),
        ((6, "", ""), 0, "nvidia-smi exited 6: no output"),
    ],
)
def test_gpus(answer: tuple[int, str, str], count: int, reason: str) -> None:
    gpus, why = node_state.gpus(commands({"nvidia-smi": answer}))
    assert (len(gpus), why) == (count, reason)
    if count:
        assert gpus[1] == {"index": 1, "name": "NVIDIA H200", "uuid": "GPU-3c4d", "compute_cap": "9.0"}


@pytest.mark.parametrize(
    ("volid", "present"),
    [
        ("local:vztmpl/debian-12-testbed_amd64.tar.zst", True),
        ("local:vztmpl/ubuntu-24.04-standard_24.04-2_amd64.tar.zst", False),
        ("local:vztmpl/debian-12", False),
    ],
)
def test_the_template_is_present_only_when_pveam_lists_it(volid: str, present: bool) -> None:
    state = node_state.read_node(commands({"pveam": (0, PVEAM_LIST, "")}), gather=[], ostemplate=volid)
    assert state["template_present"] is present
    assert "NAME" not in state["templates"]


def test_a_failing_pveam_list_fails() -> None:
    with pytest.raises(ValueError, match="pveam list local exited 2: storage 'local' does not exist"):
        node_state.templates("local", commands({"pveam": (2, "", "storage 'local' does not exist\n")}))


def test_directories_say_what_differs(tmp_path: Path) -> None:
    me, my_group = os.getuid(), os.getgid()
    good = tmp_path / "good"
    good.mkdir(mode=0o755)
    good.chmod(0o755)
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    (tmp_path / "file").write_text("")
    (tmp_path / "link").symlink_to(good)
    wanted = {"owner": me, "group": my_group, "mode": "0755"}
    dirs = [{"path": str(tmp_path / n), **wanted} for n in ("good", "loose", "file", "missing", "link")]
    dirs.append({"path": str(good), "owner": me + 1, "group": my_group, "mode": "0755"})
    state = node_state.read_node(commands({}), gather=[], directories=dirs)
    assert state["directories"] == {
        str(loose): "mode 0777, not 0755",
        str(tmp_path / "file"): "not a directory",
        str(tmp_path / "missing"): "missing",
        str(good): f"owned by {me}:{my_group}, not {me + 1}:{my_group}",
    }


def test_an_owner_the_node_does_not_know_differs(tmp_path: Path) -> None:
    item = {"path": str(tmp_path), "owner": "no-such-user-here", "mode": "0755"}
    assert "unknown on the node" in (node_state.directory_differs(item) or "")


def test_paths_are_resolved_through_links_and_dots(tmp_path: Path) -> None:
    (tmp_path / "srv").mkdir()
    (tmp_path / "models").symlink_to(tmp_path / "srv")
    state = node_state.read_node(
        commands({}), gather=[], paths=[str(tmp_path / "models" / ".." / "etc"), str(tmp_path / "models"), ""]
    )
    assert state["paths"] == {
        str(tmp_path / "models" / ".." / "etc"): {"real": str(tmp_path / "etc"), "exists": False},
        str(tmp_path / "models"): {"real": str(tmp_path / "srv"), "exists": True},
    }


def test_read_node_gathers_only_what_is_asked() -> None:
    state = node_state.read_node(commands({"nvidia-smi": (0, SMI, "")}), gather=["gpus"])
    assert sorted(state) == ["directories", "gpus", "gpus_reason", "paths"]


def test_the_module_through_ansible(tmp_path: Path) -> None:
    """The module as a play runs it (argument spec, module_utils packed with it, JSON out)."""
    (tmp_path / "cache").mkdir()
    args = {
        "gather": ["driver", "devices", "gpus"],
        "directories": [{"path": str(tmp_path / "cache"), "mode": "0700"}, {"path": str(tmp_path / "gone")}],
        "paths": [str(tmp_path / "cache" / "..")],
    }
    result = run_module("mlstack.pve.node_state", args)
    assert result.get("failed") is not True, result
    assert result["changed"] is False
    assert result["directories"][str(tmp_path / "gone")] == "missing"
    assert result["directories"][str(tmp_path / "cache")].startswith("mode ")
    assert result["paths"] == {str(tmp_path / "cache" / ".."): {"real": str(tmp_path), "exists": True}}
    # This controller has no GPU: an unknown architecture, not a failure.
    assert result["gpus"] == [] and result["gpus_reason"]
    assert "pve_version" not in result
