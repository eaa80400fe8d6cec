"""Wrong input gives PVE's kind of error, and the testbed keeps working afterwards; a token lacking a
privilege, a refused login and the 500s the project's calls can meet get PVE's exact answers."""

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from mlstack_testbed import client, paths
from mlstack_testbed.lxc import realct
from mlstack_testbed.node import access
from proxmoxer.core import ResourceException
from tbhelpers import OwnApi, remove_ct, wait_ok


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


# ------------------------------------------------------------------------------------------------------
# PVE's refusals, as a client sees them: the 403 of each permission check the project's calls can hit,
# the 401s of a refused login, the 500s. Asked of an API of this checkout's code on a port of its own
# (tbhelpers.OwnApi), so the shared server keeps running; its creates are all refused (a real container
# would be made otherwise: vmid 960, never created), CT 961 is an API record without a real container.

NEW, RECORD = 960, 961


@pytest.fixture(scope="module")
def own(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnApi]:
    served = OwnApi(tmp_path_factory.mktemp("own-api"))

    async def never(*_: Any) -> Any:
        raise AssertionError("a create on the second API passed every check")

    served.pve._real_create = never  # type: ignore[method-assign]
    served.pve.add_ct(
        RECORD, node=paths.FIRST_NODE, status="stopped", config={"hostname": "ct961", "memory": 512}
    )
    yield served
    served.stop()
    assert not realct.ct_dir(NEW).exists()


def lacking(own: OwnApi, privilege: str) -> tuple[str, str]:
    """A privilege-separated token of root@pam granted the project's privileges but `privilege`, on the
    paths the docs grant them (as tests/provision/test_api_token.py makes one through the API)."""
    name = "lacks-" + privilege.replace(".", "-")
    token_id = f"{paths.API_USER}!{name}"
    if token_id not in own.pve.tokens:
        own.pve.add_role(name, [p for p in access.PROVISION_PRIVILEGES if p != privilege])
        own.pve.add_token(token_id)
        for path in access.PROVISION_ACL_PATHS:
            own.pve.set_acl(path, [name], [token_id])
    return token_id, own.pve.token_secrets[token_id]


def create_args(template: str) -> dict[str, Any]:
    """POST /nodes/{node}/lxc as the role's create sends it (community.proxmox's parameters)."""
    return {
        "vmid": NEW,
        "ostemplate": template,
        "hostname": f"ct{NEW}",
        "unprivileged": 1,
        "cores": 2,
        "memory": 4096,
        "swap": 0,
        "rootfs": f"{paths.STORAGE}:32",
        "net0": f"name=eth0,bridge={paths.BRIDGE},ip=dhcp",
        "features": "nesting=1",
        "tags": "mlstack",
        "description": "Managed by mlstack.pve",
        "onboot": 1,
    }


def refused(call: Any) -> ResourceException:
    with pytest.raises(ResourceException) as err:
        call()
    return err.value


@pytest.mark.parametrize(
    ("privilege", "message"),
    [
        # pve-container's create_vm checks VM.Allocate with raise_perm_exc() and no argument: PVE names
        # neither path nor privilege here, the role's message does (module_utils/pve_errors).
        ("VM.Allocate", "Permission check failed"),
        ("VM.Config.CPU", f"Permission check failed (/vms/{NEW}, VM.Config.CPU)"),
        ("VM.Config.Memory", f"Permission check failed (/vms/{NEW}, VM.Config.Memory)"),
        ("VM.Config.Network", f"Permission check failed (/vms/{NEW}, VM.Config.Network)"),
        ("VM.Config.Options", f"Permission check failed (/vms/{NEW}, VM.Config.Options)"),
        ("VM.Config.Disk", f"Permission check failed (/vms/{NEW}, VM.Config.Disk)"),
        ("SDN.Use", f"Permission check failed (/sdn/zones/localnetwork/{paths.BRIDGE}, SDN.Use)"),
        # The root disk's check comes before the template's, as in PVE's create_vm.
        (
            "Datastore.AllocateSpace",
            f"Permission check failed (/storage/{paths.STORAGE}, Datastore.AllocateSpace)",
        ),
    ],
)
def test_the_creates_403_for_each_privilege_it_checks(
    own: OwnApi, testbed: client.Testbed, privilege: str, message: str
) -> None:
    token_id, secret = lacking(own, privilege)
    lxc = own.proxmox(token_id, secret).nodes(paths.FIRST_NODE).lxc
    err = refused(lambda: lxc.post(**create_args(testbed.template)))
    # proxmoxer shows PVE's status line: "403 Forbidden: <message>"
    assert (err.status_code, err.content) == (403, message)
    assert str(err) == f"403 Forbidden: {message}"
    assert not realct.ct_dir(NEW).exists()


def test_a_403s_body_is_pves(own: OwnApi, testbed: client.Testbed) -> None:
    """The status line carries the message, and the JSON body too (PVE's json formatter)."""
    token_id, secret = lacking(own, "VM.Config.Memory")
    r = requests.post(
        own.url(f"/nodes/{paths.FIRST_NODE}/lxc"),
        headers={"Authorization": f"PVEAPIToken={token_id}={secret}"},
        data=create_args(testbed.template),
        verify=own.cafile,
        timeout=30,
    )
    message = f"Permission check failed (/vms/{NEW}, VM.Config.Memory)"
    assert (r.status_code, r.reason) == (403, message)
    assert r.json() == {"data": None, "message": message + "\n"}


@pytest.mark.parametrize(
    ("privilege", "call", "message"),
    [
        # The LXC module looks for the template in the storage's content before it creates.
        (
            "Datastore.AllocateSpace",
            lambda n: n.storage(paths.STORAGE).content.get(),
            f"Permission check failed (/storage/{paths.STORAGE}, Datastore.Audit|Datastore.AllocateSpace)",
        ),
        # pve_guests' config and pending reads, the LXC module's status read.
        (
            "VM.Audit",
            lambda n: n.lxc(RECORD).config.get(),
            f"Permission check failed (/vms/{RECORD}, VM.Audit)",
        ),
        (
            "VM.Audit",
            lambda n: n.lxc(RECORD).pending.get(),
            f"Permission check failed (/vms/{RECORD}, VM.Audit)",
        ),
        (
            "VM.Audit",
            lambda n: n.lxc(RECORD).status.current.get(),
            f"Permission check failed (/vms/{RECORD}, VM.Audit)",
        ),
        # destroy.yml
        (
            "VM.Allocate",
            lambda n: n.lxc(RECORD).delete(force=1),
            f"Permission check failed (/vms/{RECORD}, VM.Allocate)",
        ),
        # A config change: the privilege of each key changed.
        (
            "VM.Config.Memory",
            lambda n: n.lxc(RECORD).config.put(memory=1024),
            f"Permission check failed (/vms/{RECORD}, VM.Config.Memory)",
        ),
        # Starting through the API (the project starts with pct on the node; the token holds no VM.PowerMgmt).
        (
            "VM.Audit",
            lambda n: n.lxc(RECORD).status.start.post(),
            f"Permission check failed (/vms/{RECORD}, VM.PowerMgmt)",
        ),
    ],
)
def test_the_403_of_the_other_calls(own: OwnApi, privilege: str, call: Any, message: str) -> None:
    token_id, secret = lacking(own, privilege)
    err = refused(lambda: call(own.proxmox(token_id, secret).nodes(paths.FIRST_NODE)))
    assert (err.status_code, err.content) == (403, message)
    assert RECORD in {ct.vmid for ct in own.pve.cts}


def test_the_403s_outside_the_projects_privileges(own: OwnApi, testbed: client.Testbed) -> None:
    token_id, secret = lacking(own, "Sys.Modify")
    api = own.proxmox(token_id, secret)
    # A privileged container needs Sys.Modify on /.
    err = refused(
        lambda: api.nodes(paths.FIRST_NODE).lxc.post(**{**create_args(testbed.template), "unprivileged": 0})
    )
    assert (err.status_code, err.content) == (403, "Permission check failed (/, Sys.Modify)")
    # Another user's permissions need Sys.Audit on /access (one's own token's do not).
    err = refused(lambda: api.access.permissions.get(userid="root@pam!other"))
    assert (err.status_code, err.content) == (403, "Permission check failed (/access, Sys.Audit)")
    assert api.access.permissions.get(path="/vms") == {
        "/vms": dict.fromkeys(sorted(access.PROVISION_PRIVILEGES), 1)
    }
    # devN is the root@pam login's only (the project writes it with pct on the node).
    err = refused(lambda: api.nodes(paths.FIRST_NODE).lxc(RECORD).config.put(dev0="/dev/null"))
    assert (err.status_code, err.content) == (
        403,
        "Permission check failed (configuring device passthrough is only allowed for root@pam)",
    )


def auth_header(token_id: str, secret: str) -> dict[str, str]:
    return {"Authorization": f"PVEAPIToken={token_id}={secret}"}


@pytest.mark.parametrize(
    ("headers", "cookies", "message"),
    [
        ({}, {}, "No ticket"),
        ({}, {"PVEAuthCookie": "PVE:root@pam:00000000::bad"}, "permission denied - invalid PVE ticket"),
        (auth_header("root@pam!lacks-Sys-Modify", "0badc0de"), {}, "invalid token value!"),
        (auth_header("root@pam!nosuch", "0badc0de"), {}, "no such token 'nosuch' for user 'root@pam'"),
        (auth_header("bob@pve!ci", "0badc0de"), {}, "no such user ('bob@pve')"),
        ({"Authorization": "PVEAPIToken=root@pam"}, {}, "no tokenid specified"),
    ],
)
def test_a_refused_login_is_pves_status_line_alone(
    own: OwnApi, headers: dict[str, str], cookies: dict[str, str], message: str
) -> None:
    """PVE's API server answers a refused login with the status line and no body."""
    lacking(own, "Sys.Modify")
    r = requests.get(
        own.url("/cluster/resources"), headers=headers, cookies=cookies, verify=own.cafile, timeout=30
    )
    assert (r.status_code, r.reason, r.content) == (401, message, b"")


def test_a_refused_token_as_proxmoxer_reports_it(own: OwnApi) -> None:
    token_id, _ = lacking(own, "Sys.Modify")
    err = refused(lambda: own.proxmox(token_id, "0badc0de").cluster.resources.get(type="vm"))
    # The empty body's parse is what proxmoxer appends against PVE too.
    assert str(err) == "401 Unauthorized: invalid token value! - {'errors': b''}"


def test_a_refused_password_login(own: OwnApi) -> None:
    """POST /access/ticket's refusal is the handler's: a 401 with PVE's JSON body."""
    r = requests.post(
        own.url("/access/ticket"),
        data={"username": "root@pam", "password": "wrong"},
        verify=own.cafile,
        timeout=30,
    )
    assert (r.status_code, r.reason) == (401, "authentication failure")
    assert r.json() == {"data": None, "message": "authentication failure\n"}


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda a: a.nodes(paths.FIRST_NODE).storage("nosuch").content.get(),
            "storage 'nosuch' does not exist",
        ),
        (
            lambda a: a.nodes("nosuch").lxc.get(),
            "hostname lookup 'nosuch' failed - failed to get address info for: nosuch: "
            "Name or service not known",
        ),
        (
            lambda a: a.nodes(paths.FIRST_NODE).lxc.post(
                vmid=RECORD, ostemplate=f"{paths.STORAGE}:vztmpl/x.tar.zst"
            ),
            f"CT {RECORD} already exists on node '{paths.FIRST_NODE}'",
        ),
    ],
)
def test_the_500s_the_projects_calls_can_meet(own: OwnApi, call: Any, message: str) -> None:
    err = refused(lambda: call(own.proxmox()))
    assert (err.status_code, err.content) == (500, message)
