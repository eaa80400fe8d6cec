"""A node's reboot, end to end on the testbed's node testbed3 (CT 300-301, onboot as every container the
project makes): provision.yml (the node plays only: create, configure, start) installs the boot unit and the
guest hookscript (gpu_boot) and sets the hookscript on both; `testbed reboot testbed3` stops them, removes
/dev/nvidia-uvm*, runs the unit ordered before pve-guests and starts the onboot containers through the API,
hookscripts and all. Both come back running with their NVIDIA nodes inside. Rebooted again with the node's
NVIDIA module unable to load, they stay stopped: the start task's log names the cause and the command, and the
node's metrics name each container and the reason. The uvm nodes are the machine's: put back with their own
numbers whatever happened (tests/lanes.py runs this file in the node-exclusive step)."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlstack_testbed.node import gpu
from playbook_runner import TESTBED_CLI, PlaybookRun, container, make_runner
from tbhelpers import attach, remove_ct

NODE = "testbed3"
VMIDS = (300, 301)
# CT 301 passes one GPU: the hookscript makes the nodes its own devN entries name.
CTS = {NODE: [container(300, mlstack_monitor=False), container(301, gpus=[0], mlstack_monitor=False)]}
UVM = ("/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


def reboot(*flags: str) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [str(TESTBED_CLI), "reboot", NODE, *flags], capture_output=True, text=True, timeout=300, check=False
    )
    print(f"$ testbed reboot {NODE} {' '.join(flags)}\n{r.stdout}{r.stderr}")
    return r


def status(api: Any, vmid: int) -> str:
    return str(api.nodes(NODE).lxc(vmid).status.current.get()["status"])


def node_ssh(testbed: Any, command: str) -> subprocess.CompletedProcess[str]:
    """`command` on node testbed3's own sshd (its pct, its /usr/sbin)."""
    node = next(n for n in testbed.nodes if n["name"] == NODE)
    argv = ["ssh", "-o", "BatchMode=yes", "-o", f"UserKnownHostsFile={testbed.ssh_known_hosts_file}"]
    argv += ["-o", "GlobalKnownHostsFile=/dev/null", "-i", testbed.ssh_key_file, "-p", str(node["ssh_port"])]
    argv += [f"root@{node['ssh_host']}", command]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def provisioned(tmp_path_factory: pytest.TempPathFactory, testbed: Any) -> Iterator[PlaybookRun]:
    """CT 300-301 on testbed3, created and started by provision.yml's node plays; afterwards the machine's
    NVIDIA nodes as the testbed made them, the node's module loadable, the containers destroyed."""
    if NODE not in [n["name"] for n in testbed.nodes]:
        pytest.fail(f"the testbed has no node {NODE}: `make testbed` makes three")
    run = make_runner(tmp_path_factory.mktemp("reboot"))
    api = testbed.proxmox()
    for vmid in VMIDS:
        remove_ct(api, testbed, vmid)
    try:
        yield run("provision.yml", CTS, limit=NODE)
    finally:
        gpu.module_missing_marker(NODE).unlink(missing_ok=True)
        print(f"put back: {gpu.restore_created()}")
        run("destroy.yml", CTS, limit=NODE, mlstack_destroy_confirm=True)
        for vmid in VMIDS:
            remove_ct(testbed.proxmox(), testbed, vmid)


def test_containers_come_back_with_their_gpus(provisioned: PlaybookRun, testbed: Any) -> None:
    assert provisioned.rc == 0, provisioned.output[-4000:]
    api = testbed.proxmox()
    for vmid in VMIDS:
        assert api.nodes(NODE).lxc(vmid).config.get().get("hookscript") == "local:snippets/mlstack-gpu-hook"
    before = {p: os.stat(p).st_rdev for p in UVM}

    r = reboot()

    assert r.returncode == 0, r.stdout + r.stderr
    assert "removed /dev/nvidia-uvm\n" in r.stdout
    assert "mlstack-gpu-nodes.service: done" in r.stdout
    assert {p: os.stat(p).st_rdev for p in UVM} == before
    for vmid in VMIDS:
        assert f"started CT {vmid}" in r.stdout
        assert status(api, vmid) == "running"
    nodes = " ".join(["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl", *UVM])
    inside = attach(300, f"for n in {nodes}; do test -c $n || echo missing $n; done")
    assert inside.returncode == 0 and inside.stdout == "", inside.stdout + inside.stderr
    # CT 301's one GPU: nvidia0 and the shared nodes, not nvidia1.
    inside = attach(301, "ls /dev | grep nvidia")
    assert {"nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"} <= set(inside.stdout.split()), (
        inside.stdout
    )
    assert "nvidia1" not in inside.stdout.split(), inside.stdout


def test_a_module_that_cannot_load_leaves_them_stopped_and_says_why(
    provisioned: PlaybookRun, testbed: Any, tmp_path: Path
) -> None:
    assert provisioned.rc == 0, provisioned.output[-4000:]
    api = testbed.proxmox()

    r = reboot("--module-missing")
    try:
        assert r.returncode == 1, r.stdout + r.stderr
        for vmid in VMIDS:
            assert status(api, vmid) == "stopped"
            assert f"CT {vmid} did not start: hookscript error for {vmid} on pre-start" in r.stdout
            assert (
                f"mlstack-gpu-hook: CT {vmid} not started: /dev/nvidia-uvm /dev/nvidia-uvm-tools missing and "
                "`nvidia-modprobe -u -c=0` failed (exit 1): modprobe: FATAL: Module nvidia not found"
            ) in r.stdout
            assert f"then `pct start {vmid}`." in r.stdout
        metrics = node_ssh(testbed, f"mlstack-node-metrics --out {tmp_path}/node.prom")
        assert metrics.returncode == 0, metrics.stdout + metrics.stderr
        text = (tmp_path / "node.prom").read_text()
        for vmid in VMIDS:
            assert f'mlstack_ct_start_blocked{{vmid="{vmid}",reason="module_load_failed"}} 1' in text, text
        # What `pct start` on the node says, as a person would try it.
        again = node_ssh(testbed, "pct start 300")
        assert again.returncode != 0 and "dkms autoinstall" in again.stderr, again.stdout + again.stderr
    finally:
        gpu.restore_created()

    r = reboot()
    assert r.returncode == 0, r.stdout + r.stderr
    assert all(status(api, vmid) == "running" for vmid in VMIDS)
    metrics = node_ssh(testbed, f"mlstack-node-metrics --out {tmp_path}/after.prom")
    assert "mlstack_ct_start_blocked" not in (tmp_path / "after.prom").read_text()
