from __future__ import annotations

import pytest
from ansible.errors import AnsibleFilterError
from ansible_collections.mlstack.pve.plugins.filter import container_options as f

NODES = [
    "/dev/nvidia1",
    "/dev/nvidia0",
    "/dev/nvidia10",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-caps/nvidia-cap1",
    "/dev/nvme0n1",
]


@pytest.mark.parametrize(
    ("gpus", "expected"),
    [
        ("none", []),
        ([], []),
        (False, []),
        (
            "all",
            [
                "/dev/nvidia0",
                "/dev/nvidia1",
                "/dev/nvidia10",
                "/dev/nvidia-caps/nvidia-cap1",
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
                "/dev/nvidiactl",
            ],
        ),
        (
            [1],
            [
                "/dev/nvidia1",
                "/dev/nvidia-caps/nvidia-cap1",
                "/dev/nvidia-uvm",
                "/dev/nvidia-uvm-tools",
                "/dev/nvidiactl",
            ],
        ),
    ],
)
def test_selected_gpu_nodes(gpus: object, expected: list[str]) -> None:
    assert f.selected_gpu_nodes(NODES, gpus) == expected


def test_only_nvidia_nodes_are_ever_selected() -> None:
    assert "/dev/nvme0n1" not in f.selected_gpu_nodes(NODES, "all")


@pytest.mark.parametrize("gpus", [[7], "some", [True], ["0"]])
def test_bad_gpu_selection_is_refused(gpus: object) -> None:
    with pytest.raises(AnsibleFilterError):
        f.selected_gpu_nodes(NODES, gpus)


@pytest.mark.parametrize("gpus", [0, 1])
def test_a_bare_index_is_refused_saying_how_to_write_it(gpus: int) -> None:
    with pytest.raises(AnsibleFilterError, match=rf"write \[{gpus}\] for GPU {gpus}, or none for no GPU"):
        f.selected_gpu_nodes(NODES, gpus)


def test_device_options_number_nodes_in_order() -> None:
    options = f.device_options(["/dev/nvidiactl", "/dev/nvidia0"], "all", gid=44, mode="0666")
    assert options == {"dev0": "/dev/nvidia0,gid=44,mode=0666", "dev1": "/dev/nvidiactl,gid=44,mode=0666"}


def test_mount_options_skip_empty_hosts_and_mark_read_only() -> None:
    mounts = [
        {"host": "/var/lib/mlstack/cache/uv", "ct": "/var/cache/mlstack/uv"},
        {"host": "", "ct": "/unused"},
        {"host": "/srv/models/q", "ct": "/models", "ro": True},
    ]
    assert f.mount_options(mounts) == {
        "mp0": "/var/lib/mlstack/cache/uv,mp=/var/cache/mlstack/uv",
        "mp1": "/srv/models/q,mp=/models,ro=1",
    }
