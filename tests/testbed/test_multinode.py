"""The testbed as a cluster of three PVE nodes: one API for the cluster, each node its own SSH host (its own
address and host key) with its own pct, vmids unique across the cluster, and a node's pct blind to the
containers of the others, as on PVE. Uses vmids 935-936."""

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlstack_testbed import client
from mlstack_testbed.lxc import realct
from proxmoxer.core import ResourceException
from tbhelpers import run

REPO = Path(__file__).resolve().parents[2]
TESTBED = REPO / "testbed" / "testbed"
VMIDS = (935, 936)


def node_ssh(
    testbed: client.Testbed, node: dict[str, Any], command: str, known_hosts: str | None = None
) -> Any:
    return run(
        [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            f"UserKnownHostsFile={known_hosts or testbed.ssh_known_hosts_file}",
            "-o",
            "GlobalKnownHostsFile=/dev/null",
            "-o",
            "StrictHostKeyChecking=yes",
            "-i",
            testbed.ssh_key_file,
            "-p",
            str(node["ssh_port"]),
            f"root@{node['ssh_host']}",
            command,
        ],
        timeout=60,
    )


def node_of(api: Any, vmid: int) -> str | None:
    return next((r["node"] for r in api.cluster.resources.get(type="vm") if int(r["vmid"]) == vmid), None)


def destroy(api: Any, vmid: int) -> None:
    node = node_of(api, vmid)
    if node:
        ct = api.nodes(node).lxc(vmid)
        if ct.status.current.get()["status"] == "running":
            client.wait_task(api, node, ct.status.stop.post(), 60)
        client.wait_task(api, node, ct.delete(purge=1), 120)
    if realct.exists(vmid) or realct.ct_dir(vmid).exists():
        realct.destroy(vmid)


@pytest.fixture
def cluster(testbed: client.Testbed) -> Iterator[tuple[Any, dict[str, dict[str, Any]]]]:
    nodes = {n["name"]: n for n in testbed.nodes}
    api = testbed.proxmox()
    for vmid in VMIDS:
        destroy(api, vmid)
    yield api, nodes
    for vmid in VMIDS:
        destroy(api, vmid)


def status() -> dict[str, Any]:
    r = subprocess.run([str(TESTBED), "status", "--json"], capture_output=True, text=True, check=False)
    return dict(json.loads(r.stdout))


def create(api: Any, testbed: client.Testbed, node: str, vmid: int) -> None:
    upid = api.nodes(node).lxc.post(
        vmid=vmid, ostemplate=testbed.template, hostname=f"mn{vmid}", storage=testbed.storage, unprivileged=1
    )
    status = client.wait_task(api, node, upid, 180)
    assert status["exitstatus"] == "OK", client.task_log(api, node, upid)


def test_three_nodes_each_with_its_own_ssh_host_and_host_key(testbed: client.Testbed, cluster: Any) -> None:
    api, nodes = cluster
    assert list(nodes) == ["testbed", "testbed2", "testbed3"]
    assert sorted(n["node"] for n in api.nodes.get()) == ["testbed", "testbed2", "testbed3"]
    assert len({n["ssh_host"] for n in nodes.values()}) == 3
    lines = Path(testbed.ssh_known_hosts_file).read_text().splitlines()
    keys = {line.split()[0]: line.split()[2] for line in lines}
    assert set(keys) == {f"[{n['ssh_host']}]:{n['ssh_port']}" for n in nodes.values()}
    assert len(set(keys.values())) == 3, "each node has its own host key"
    for name, node in nodes.items():
        r = node_ssh(testbed, node, "pveversion")
        assert r.returncode == 0 and "pve-manager/" in r.stdout, (name, r.stderr)


def test_a_node_presenting_another_nodes_key_is_refused(
    testbed: client.Testbed, cluster: Any, tmp_path: Path
) -> None:
    _, nodes = cluster
    two, three = nodes["testbed2"], nodes["testbed3"]
    line2 = next(
        ln
        for ln in Path(testbed.ssh_known_hosts_file).read_text().splitlines()
        if ln.startswith(f"[{two['ssh_host']}]")
    )
    # testbed3's address pinned with testbed2's key: ssh must refuse to talk to it.
    swapped = tmp_path / "known_hosts"
    swapped.write_text(line2.replace(f"[{two['ssh_host']}]", f"[{three['ssh_host']}]", 1) + "\n")
    r = node_ssh(testbed, three, "true", known_hosts=str(swapped))
    assert r.returncode == 255 and "Host key verification failed" in r.stderr, r.stderr


def test_vmids_are_unique_across_the_cluster_and_each_pct_sees_its_own_node(
    testbed: client.Testbed, cluster: Any
) -> None:
    api, nodes = cluster
    create(api, testbed, "testbed2", 935)
    assert node_of(api, 935) == "testbed2"
    with pytest.raises(ResourceException) as err:
        api.nodes("testbed3").lxc.post(vmid=935, ostemplate=testbed.template, storage=testbed.storage)
    assert "CT 935 already exists on node 'testbed2'" in str(err.value.content)

    # Only testbed2's pct knows CT 935; the others answer as PVE does for a CT of another node.
    assert "935" in node_ssh(testbed, nodes["testbed2"], "pct list").stdout
    assert "935" not in node_ssh(testbed, nodes["testbed3"], "pct list").stdout
    r = node_ssh(testbed, nodes["testbed"], "pct config 935")
    assert (
        r.returncode == 255 and "Configuration file 'nodes/testbed/lxc/935.conf' does not exist" in r.stderr
    )

    r = node_ssh(testbed, nodes["testbed2"], "pct start 935 && pct exec 935 -- cat /etc/hostname")
    assert r.returncode == 0 and r.stdout.strip() == "mn935", r.stderr
    r = node_ssh(testbed, nodes["testbed"], "pct exec 935 -- true")
    assert r.returncode == 255, "a node's pct must not reach another node's container"
    assert "Configuration file 'nodes/testbed/lxc/935.conf' does not exist" in r.stderr


def test_up_refuses_to_drop_a_node_that_holds_a_container(testbed: client.Testbed, cluster: Any) -> None:
    api, _ = cluster
    create(api, testbed, "testbed3", 936)
    before = status()
    r = subprocess.run(
        [str(TESTBED), "up", "--nodes", "2"], capture_output=True, text=True, timeout=600, check=False
    )
    assert r.returncode == 1
    said = r.stdout + r.stderr
    assert "--nodes 2 would drop testbed3, which still hold(s) " in said and "CT 936 on testbed3" in said, (
        said
    )
    assert sorted(n["node"] for n in api.nodes.get()) == ["testbed", "testbed2", "testbed3"]
    # Refused before any step: the nodes, their sshd and the node state others rely on are as they were.
    after = status()
    assert [n["name"] for n in after["nodes"] if n["sshd_pid"]] == ["testbed", "testbed2", "testbed3"]
    assert after["nodes"] == before["nodes"]
    assert (after["gpu_model"], after.get("driver_version")) == (
        before["gpu_model"],
        before.get("driver_version"),
    )
