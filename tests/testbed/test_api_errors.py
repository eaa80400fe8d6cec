"""Wrong input gives PVE's kind of error, and the testbed keeps working afterwards."""

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mlstack_testbed import client
from mlstack_testbed.lxc import realct
from proxmoxer.core import ResourceException
from tbhelpers import remove_ct, wait_ok


@pytest.fixture(autouse=True)
def still_works(api: Any, testbed: client.Testbed) -> Iterator[None]:
    yield
    assert api.version.get()["version"]
    assert isinstance(api.nodes(testbed.node).lxc.get(), list)


@pytest.mark.parametrize("call", ["status", "config", "set"])
def test_wrong_vmid(api: Any, testbed: client.Testbed, call: str) -> None:
    ct = api.nodes(testbed.node).lxc(949)
    with pytest.raises(ResourceException) as err:
        {"status": ct.status.current.get, "config": ct.config.get, "set": lambda: ct.config.put(memory=1024)}[
            call
        ]()
    assert err.value.status_code == 500
    assert f"Configuration file 'nodes/{testbed.node}/lxc/949.conf' does not exist" in str(err.value.content)


def test_wrong_vmid_start_fails_the_task(api: Any, testbed: client.Testbed) -> None:
    upid = api.nodes(testbed.node).lxc(949).status.start.post()
    status = client.wait_task(api, testbed.node, upid, 30)
    assert "Configuration file" in status["exitstatus"] and "949.conf' does not exist" in status["exitstatus"]


def test_missing_template(api: Any, testbed: client.Testbed, cleanup: Any) -> None:
    vmid = cleanup(910)
    upid = api.nodes(testbed.node).lxc.post(
        vmid=vmid, ostemplate="local:vztmpl/no-such-template_amd64.tar.zst", storage=testbed.storage
    )
    status = client.wait_task(api, testbed.node, upid, 60)
    assert status["exitstatus"] == (
        f"unable to create CT {vmid} - volume 'local:vztmpl/no-such-template_amd64.tar.zst' does not exist"
    )
    assert not realct.ct_dir(vmid).exists()
    with pytest.raises(ResourceException):
        api.nodes(testbed.node).lxc(vmid).config.get()


@pytest.fixture(scope="module")
def stopped_ct(api: Any, testbed: client.Testbed) -> Iterator[int]:
    vmid = 911
    remove_ct(api, testbed, vmid)
    wait_ok(
        api,
        testbed,
        api.nodes(testbed.node).lxc.post(vmid=vmid, ostemplate=testbed.template, storage=testbed.storage),
    )
    yield vmid
    remove_ct(api, testbed, vmid)


@pytest.mark.parametrize(
    ("value", "code", "message"),
    [
        ("/dev/nvidia99,gid=44", 500, "Device /dev/nvidia99 does not exist"),
        ("path=/dev/nvidia98", 500, "Device /dev/nvidia98 does not exist"),
        ("/dev/shm", 500, "/dev/shm is not a device"),
        ("/tmp/nvidia0", 400, "/tmp/nvidia0 is not a valid device path"),
        ("/dev/../etc/passwd", 400, "/dev/../etc/passwd is not a valid device path"),
    ],
)
def test_bad_dev_path_on_config(
    api: Any, testbed: client.Testbed, stopped_ct: int, value: str, code: int, message: str
) -> None:
    vmid = stopped_ct
    lxc = api.nodes(testbed.node).lxc
    with pytest.raises(ResourceException) as err:
        lxc(vmid).config.put(dev0=value)
    assert err.value.status_code == code
    assert message in str(err.value.content) + str(err.value.errors)
    assert "dev0" not in lxc(vmid).config.get()


def test_bad_dev_path_on_create(api: Any, testbed: client.Testbed, cleanup: Any) -> None:
    vmid = cleanup(912)
    with pytest.raises(ResourceException) as err:
        api.nodes(testbed.node).lxc.post(
            vmid=vmid, ostemplate=testbed.template, storage=testbed.storage, dev0="/dev/nvidia97"
        )
    assert err.value.status_code == 500 and "Device /dev/nvidia97 does not exist" in str(err.value.content)
    assert not realct.ct_dir(vmid).exists()


def test_device_gone_at_start(api: Any, testbed: client.Testbed, cleanup: Any) -> None:
    """PVE checks devN again at start: a node that vanished fails the start task."""
    vmid = cleanup(913)
    node = Path("/dev/mlstack-testbed-null")
    os.mknod(node, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    try:
        lxc = api.nodes(testbed.node).lxc
        wait_ok(
            api,
            testbed,
            lxc.post(vmid=vmid, ostemplate=testbed.template, storage=testbed.storage, dev0=str(node)),
        )
    finally:
        node.unlink()
    upid = lxc(vmid).status.start.post()
    status = client.wait_task(api, testbed.node, upid, 60)
    assert status["exitstatus"] == f"startup for container '{vmid}' failed"
    assert f"Device {node} does not exist" in client.task_log(api, testbed.node, upid)
    assert realct.state(vmid)[0] == "stopped"
    assert lxc(vmid).status.current.get()["status"] == "stopped"


def test_bind_source_missing_at_start(api: Any, testbed: client.Testbed, cleanup: Any) -> None:
    vmid = cleanup(914)
    lxc = api.nodes(testbed.node).lxc
    wait_ok(api, testbed, lxc.post(vmid=vmid, ostemplate=testbed.template, storage=testbed.storage))
    lxc(vmid).config.put(mp0="/var/tmp/mlstack-no-such-dir,mp=/mnt/x")
    upid = lxc(vmid).status.start.post()
    status = client.wait_task(api, testbed.node, upid, 60)
    assert status["exitstatus"] == f"startup for container '{vmid}' failed"
    assert "directory '/var/tmp/mlstack-no-such-dir' does not exist" in client.task_log(
        api, testbed.node, upid
    )


def test_duplicate_vmid(api: Any, testbed: client.Testbed, cleanup: Any) -> None:
    vmid = cleanup(915)
    lxc = api.nodes(testbed.node).lxc
    wait_ok(api, testbed, lxc.post(vmid=vmid, ostemplate=testbed.template, storage=testbed.storage))
    with pytest.raises(ResourceException) as err:
        lxc.post(vmid=vmid, ostemplate=testbed.template, storage=testbed.storage)
    assert f"CT {vmid} already exists on node '{testbed.node}'" in str(err.value.content)
