"""A passed-through device node (/dev/nvidia1, one of the testbed's dummies) removed from the node
before the shared CT starts, as after a GPU falls off the bus or a reboot without the driver.

1. Removed before the run: the preflight names the container, the key and the node, and how to fix
   the node; nothing changes and the container stays as it was (stopped, config intact).
2. Removed between configuring and starting (injected as the start task begins), the driver still there:
   the container's hookscript (gpu_boot) makes the node again at pre-start and the container starts.
3. Removed so, and the NVIDIA module cannot load: the hookscript refuses the start, and the run reports
   that refusal from PVE's task log, with the cause and the fix; the node's metrics name the container.
4. Node back: a rerun starts the container and completes.

The node is machine-wide: it is put back right after each run, in a finally."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from faultlib import fault_env, one_line, venv_works
from mlstack_testbed.node import gpu
from tbhelpers import wait_ok

NODE = "/dev/nvidia1"


class DevNode:
    def __init__(self, path: str) -> None:
        st = os.stat(path)
        assert stat.S_ISCHR(st.st_mode), f"{path} is not a device node"
        self.path, self.st = path, st

    def remove(self) -> None:
        Path(self.path).unlink(missing_ok=True)

    def remove_command(self) -> str:
        return f"rm -f {self.path}"

    def restore(self) -> None:
        if not os.path.exists(self.path):
            os.mknod(self.path, self.st.st_mode, self.st.st_rdev)
            os.chmod(self.path, stat.S_IMODE(self.st.st_mode))
            os.chown(self.path, self.st.st_uid, self.st.st_gid)


@pytest.fixture
def dev_node(testbed: Any) -> Iterator[DevNode]:
    assert NODE in testbed.gpu_nodes
    node = DevNode(NODE)
    try:
        yield node
    finally:
        node.restore()


def status(api: Any, testbed: Any, vmid: int) -> str:
    return str(api.nodes(testbed.node).lxc(vmid).status.current.get()["status"])


def devices(api: Any, testbed: Any, vmid: int) -> dict[str, str]:
    config = api.nodes(testbed.node).lxc(vmid).config.get()
    return {k: v for k, v in config.items() if k.startswith("dev")}


@pytest.mark.slow
def test_device_node_removed_before_start(
    runner: Any, shared_ct: dict[str, Any], api: Any, testbed: Any, dev_node: DevNode, tmp_path: Path
) -> None:
    vmid = int(shared_ct["vmid"])
    quick = {"doctor_tier": "quick"}
    wait_ok(api, testbed, api.nodes(testbed.node).lxc(vmid).status.stop.post())
    passed_through = devices(api, testbed, vmid)
    assert any(v.split(",")[0] == NODE for v in passed_through.values()), passed_through

    # 1. Gone before the run: the preflight says so, and how to fix the node.
    dev_node.remove()
    try:
        early = runner("provision.yml", [shared_ct], **quick)
    finally:
        dev_node.restore()
    text = one_line(early.output)
    assert early.rc != 0
    assert f"CT {vmid} passes {NODE} through" in text, early.output[-3000:]
    assert f"but node testbed has no {NODE}" in text
    assert "`nvidia-smi` must list every GPU" in text
    assert early.changed() == 0, early.changed_tasks()
    assert status(api, testbed, vmid) == "stopped"
    assert devices(api, testbed, vmid) == passed_through

    # 2. Gone between configuring and starting, the driver still loaded: the hookscript makes it again.
    mark = tmp_path / "fault.mark"
    # When the start task begins (the config already matches, so nothing else runs between).
    env = fault_env("Start container", dev_node.remove_command(), mark, when="start")
    try:
        late = runner("provision.yml", [shared_ct], env=env, **quick)
        made_again = os.path.exists(NODE)
    finally:
        dev_node.restore()
    # Where the start no longer goes through a task of this name, this phase fails here, never vanishes.
    assert mark.exists(), "the fault did not fire: no task 'Start container' ran (container.yml's start)"
    assert late.rc == 0, late.output[-4000:]
    assert made_again, f"{NODE} was not made again before the start"
    assert status(api, testbed, vmid) == "running"
    assert devices(api, testbed, vmid) == passed_through
    wait_ok(api, testbed, api.nodes(testbed.node).lxc(vmid).status.stop.post())

    # 3. Gone so, and the module cannot load: the hookscript refuses the start with the cause and the fix.
    marker = gpu.module_missing_marker(testbed.node)
    mark = tmp_path / "fault-module.mark"
    env = fault_env("Start container", f"{dev_node.remove_command()} && : > {marker}", mark, when="start")
    try:
        refused = runner("provision.yml", [shared_ct], env=env, **quick)
    finally:
        marker.unlink(missing_ok=True)
        dev_node.restore()
    assert mark.exists(), "the fault did not fire: no task 'Start container' ran (container.yml's start)"
    text = one_line(refused.output)
    assert refused.rc != 0
    assert f"CT {vmid} did not start" in text, refused.output[-3000:]
    assert f"mlstack-gpu-hook: CT {vmid} not started: {NODE}" in text, refused.output[-3000:]
    assert "modprobe: FATAL: Module nvidia not found" in text
    assert f"then `pct start {vmid}`" in text
    assert status(api, testbed, vmid) == "stopped"
    assert devices(api, testbed, vmid) == passed_through

    # 4. Node back: a rerun starts the container and completes; the venv still works.
    again = runner("provision.yml", [shared_ct], **quick)
    assert again.rc == 0, again.output[-4000:]
    assert status(api, testbed, vmid) == "running"
    assert devices(api, testbed, vmid) == passed_through
    assert venv_works(vmid)
