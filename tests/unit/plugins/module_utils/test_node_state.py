"""mlstack.pve.node_state: the node's state as pve_host acts on it - the PVE version, the driver, the
device nodes, the GPUs, the template listing, directories and resolved paths - on real files, with the
node's commands (pveversion, nvidia-smi, pveam) answered as the real ones answer."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
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


def test_the_nodes_commands_run_at_the_same_time() -> None:
    """pveversion answers only once nvidia-smi, pveam and the container's lxc-info have started: one after
    the other, it would wait out its timeout and the read would say so."""
    started = {name: threading.Event() for name in ("nvidia-smi", "pveam", "lxc-info")}
    answers = {"nvidia-smi": (0, SMI, ""), "pveam": (0, PVEAM_LIST, ""), "lxc-info": (0, "", "")}

    def run(argv: list[str]) -> tuple[int, str, str]:
        if argv[0] == "pveversion":
            together = all(e.wait(timeout=10) for e in started.values())
            return (0, PVEVERSION, "") if together else (1, "", "the others had not started")
        started[argv[0]].set()
        return answers[argv[0]]

    state = node_state.read_node(
        run, gather=["pve_version", "gpus"], ostemplate="local:vztmpl/x.tar.zst", containers=[220]
    )
    assert state["pve_version"] == "8.4.1" and len(state["gpus"]) == 2 and state["stale_mounts"] == []


def test_with_the_commands_at_once_the_first_failure_listed_is_the_one_raised() -> None:
    # pveam fails at once, pveversion after it: the error is pveversion's, as when they ran in turn.
    def run(argv: list[str]) -> tuple[int, str, str]:
        if argv[0] == "pveversion":
            time.sleep(0.2)
            return (2, "", "ipcc_send_rec failed\n")
        return (2, "", "storage 'local' does not exist\n")

    with pytest.raises(ValueError, match="pveversion exited 2: ipcc_send_rec failed"):
        node_state.read_node(run, gather=["pve_version"], ostemplate="local:vztmpl/x.tar.zst")


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
        # Not a vmid: left out, as the inventory's own check names it; 220 does not run here.
        "containers": ["not-a-vmid", 220],
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
    assert result["stale_mounts"] == []


# A running container's bind mounts against the node's folders (the shared caches, models): a folder
# removed or replaced on the node stays the old one inside until the container starts again.
NODE_ID, OTHER_ID = (65024, 2154563), (65024, 2154515)


@pytest.mark.parametrize(
    ("root", "in_container", "on_node", "said"),
    [
        ("/var/lib/mlstack/cache/uv", NODE_ID, NODE_ID, None),
        # rm -rf on the node: the container's mount is of the deleted folder, made again or not.
        (
            "/var/lib/mlstack/cache/uv//deleted",
            OTHER_ID,
            NODE_ID,
            "was removed on the node while the container ran",
        ),
        (
            "/var/lib/mlstack/cache/uv//deleted",
            OTHER_ID,
            None,
            "was removed on the node while the container ran",
        ),
        # mv aside and a new folder in its place: both exist, the container has the old one.
        (
            "/var/lib/mlstack/cache/uv.old",
            OTHER_ID,
            NODE_ID,
            "was replaced on the node while the container ran",
        ),
        ("/var/lib/mlstack/cache/uv.old", OTHER_ID, None, "is missing on the node"),
        ("/srv/models", "Stale file handle", NODE_ID, "cannot be read in the container (Stale file handle)"),
        # Nothing mounted there (a mount point added since the container started): nothing to compare.
        (None, "No such file or directory", NODE_ID, None),
    ],
)
def test_mount_differs(
    root: str | None, in_container: tuple[int, int] | str, on_node: tuple[int, int] | None, said: str | None
) -> None:
    why = node_state.mount_differs(root, in_container, on_node)
    assert (why is None) == (said is None) and (said is None or why.startswith(said)), why


def test_bind_mounts_are_the_mpN_with_a_node_path_in_order() -> None:
    config = {
        "mp10": "/srv/models/x,mp=/models/x,ro=1",
        "mp2": "/var/lib/mlstack/cache/triton/,mp=/var/cache/mlstack/triton",
        "mp0": "volume=/var/lib/mlstack/cache/uv,mp=/var/cache/mlstack/uv,backup=0",
        "mp1": "local:220/vm-220-disk-1.raw,mp=/data,size=8G",
        "rootfs": "local:220/vm-220-disk-0.raw,size=16G",
        "dev0": "/dev/nvidia0,gid=44,mode=0666",
    }
    assert node_state.bind_mounts(config) == [
        ("/var/lib/mlstack/cache/uv", "/var/cache/mlstack/uv"),
        ("/var/lib/mlstack/cache/triton", "/var/cache/mlstack/triton"),
        ("/srv/models/x", "/models/x"),
    ]


def test_mount_roots_decode_escapes_and_the_last_mount_on_a_point_wins() -> None:
    mountinfo = (
        "100 90 254:0 / / rw,relatime - ext4 /dev/vda rw\n"
        "141 100 254:0 /srv/my\\040models /models ro,relatime - ext4 /dev/vda rw\n"
        "142 100 254:0 /var/lib/mlstack/cache/uv /var/cache/mlstack/uv rw - ext4 /dev/vda rw\n"
        "150 142 254:0 /var/lib/mlstack/cache/uv2//deleted /var/cache/mlstack/uv rw - ext4 /dev/vda rw\n"
    )
    assert node_state.mount_roots(mountinfo) == {
        "/": "/",
        "/models": "/srv/my models",
        "/var/cache/mlstack/uv": "/var/lib/mlstack/cache/uv2//deleted",
    }


@pytest.mark.parametrize(
    ("answer", "pid"),
    [((0, "4242\n", ""), 4242), ((0, "", ""), None), ((1, "", "220 doesn't exist\n"), None)],
    ids=["running", "stopped", "unknown"],
)
def test_init_pid_from_lxc_info(answer: tuple[int, str, str], pid: int | None) -> None:
    asked: list[list[str]] = []

    def run(argv: list[str]) -> tuple[int, str, str]:
        asked.append(argv)
        return answer

    assert node_state.init_pid(220, run) == pid
    assert asked == [["lxc-info", "-n", "220", "-p", "-H"]]


def test_the_config_is_pves_file_else_pct_config_current(tmp_path: Path) -> None:
    (tmp_path / "220.conf").write_text("mp0: /a,mp=/b\n\n[pve:pending]\nmp0: /c,mp=/b\n")
    asked: list[list[str]] = []

    def run(argv: list[str]) -> tuple[int, str, str]:
        asked.append(argv)
        return (0, "mp0: /d,mp=/b\n", "") if argv[2] == "221" else (255, "", "does not exist")

    assert node_state.container_config(220, run, str(tmp_path)) == {"mp0": "/a,mp=/b"}
    assert node_state.container_config(221, run, str(tmp_path)) == {"mp0": "/d,mp=/b"}
    assert node_state.container_config(222, run, str(tmp_path)) == {}
    assert asked == [
        ["/usr/sbin/pct", "config", "221", "--current"],
        ["/usr/sbin/pct", "config", "222", "--current"],
    ]


@pytest.fixture
def bound(tmp_path: Path) -> Iterator[tuple[int, Path, Path]]:
    """A process in a mount namespace of its own with tmp/node bind-mounted at tmp/ct, as a container's
    init has the node's folder (needs root and unshare)."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root and unshare for a mount namespace")
    node, ct = tmp_path / "node", tmp_path / "ct"
    node.mkdir()
    ct.mkdir()
    proc = subprocess.Popen(
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            f"mount --bind {node} {ct} && echo up && exec sleep 120",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "up"
    yield proc.pid, node, ct
    proc.kill()
    proc.wait()


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("", None),
        ("rm -rf {node}", "was removed on the node"),
        ("rm -rf {node} && mkdir {node}", "was removed on the node"),
        ("mv {node} {node}.old && mkdir {node}", "was replaced on the node"),
    ],
    ids=["intact", "removed", "removed-and-made-again", "moved-aside-and-made-again"],
)
def test_stale_mounts_of_a_real_mount(
    bound: tuple[int, Path, Path], tmp_path: Path, change: str, said: str | None
) -> None:
    pid, node, ct = bound
    (tmp_path / "220.conf").write_text(
        f"hostname: t-220\nmp0: {node},mp={ct}\nmp1: /nowhere,mp=/not-mounted\n"
    )
    if change:
        subprocess.run(["sh", "-c", change.format(node=node)], check=True)
    lxc_info = commands({"lxc-info": (0, f"{pid}\n", "")})
    found = node_state.stale_mounts([220], lxc_info, config_dir=str(tmp_path))
    if said is None:
        assert found == []
    else:
        assert [(f["vmid"], f["folder"], f["mount_point"]) for f in found] == [(220, str(node), str(ct))]
        assert found[0]["why"].startswith(said), found
        assert found[0]["summary"] == f"CT 220: {node}, bound at {ct}, {found[0]['why']}"


def test_stopped_containers_are_not_read() -> None:
    stopped = commands({"lxc-info": (0, "", "")})
    assert node_state.read_node(stopped, gather=[], containers=[220])["stale_mounts"] == []
    assert "stale_mounts" not in node_state.read_node(stopped, gather=[])
