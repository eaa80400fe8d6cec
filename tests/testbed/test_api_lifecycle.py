"""Through proxmoxer against the testbed: API actions happen to REAL LXC containers."""

import os
import re
import stat
from pathlib import Path
from typing import Any

from mlstack_testbed import client
from mlstack_testbed.lxc import realct
from proxmoxer.core import ResourceException
from tbhelpers import attach, run, wait_ok, wait_takes_halt


def test_ct_is_running_in_lxc(ct900: dict[str, Any]) -> None:
    r = run(["lxc-info", "-n", "900", "-s"])
    assert "RUNNING" in r.stdout


def test_api_status_says_running(api: Any, testbed: client.Testbed, ct900: dict[str, Any]) -> None:
    st = api.nodes(testbed.node).lxc(900).status.current.get()
    assert st["status"] == "running"
    assert st["pid"] == realct.state(900)[1]
    listed = {c["vmid"]: c["status"] for c in api.nodes(testbed.node).lxc.get()}
    assert listed[900] == "running"


def test_ct_is_unprivileged(ct900: dict[str, Any]) -> None:
    config = Path("/var/lib/lxc/900/config").read_text()
    assert "lxc.idmap = u 0 100000 65536" in config
    assert os.stat("/var/lib/lxc/900/rootfs/etc/passwd").st_uid == 100000
    assert attach(900, "id -u").stdout.strip() == "0"


def test_bind_mount_visible_inside(ct900: dict[str, Any], share_dir: Path) -> None:
    r = attach(900, "cat /mnt/share/hello.txt")
    assert r.returncode == 0, r.stderr
    assert r.stdout == (share_dir / "hello.txt").read_text()


def test_device_node_visible_inside(ct900: dict[str, Any]) -> None:
    host = os.stat("/dev/nvidia0")
    r = attach(900, "stat -c '%F %t:%T %g %a' /dev/nvidia0")
    *kind, numbers, gid, mode = r.stdout.split()
    assert " ".join(kind) == "character special file"
    assert numbers == f"{os.major(host.st_rdev):x}:{os.minor(host.st_rdev):x}"
    assert (gid, mode) == ("44", "666")


def test_device_opens_with_enxio(ct900: dict[str, Any]) -> None:
    """The cgroup allows the device; no driver answers: ENXIO, not EPERM."""
    r = attach(900, "head -c1 /dev/nvidia0")
    assert r.returncode != 0
    assert "No such device or address" in r.stderr


def test_real_config_translates_dev0(ct900: dict[str, Any]) -> None:
    config = Path("/var/lib/lxc/900/config").read_text()
    host = os.stat("/dev/nvidia0")
    assert f"lxc.cgroup2.devices.allow = c {os.major(host.st_rdev)}:{os.minor(host.st_rdev)} rw" in config
    assert re.search(
        r"lxc.mount.entry = /var/lib/lxc/900/passthrough/dev/nvidia0 dev/nvidia0 none bind,create=file",
        config,
    )
    node = os.stat("/var/lib/lxc/900/passthrough/dev/nvidia0")
    assert stat.S_ISCHR(node.st_mode) and node.st_gid == 100044 and stat.S_IMODE(node.st_mode) == 0o666


def test_container_reaches_network(ct900: dict[str, Any]) -> None:
    r = attach(
        900,
        "for i in $(seq 30); do ip -4 -o addr show eth0 | grep -q 'inet 10.0.3.' && exit 0; "
        "sleep 1; done; exit 1",
        timeout=40,
    )
    assert r.returncode == 0, "no DHCP address on eth0"


def test_destroy_through_api_removes_it(api: Any, testbed: client.Testbed, cleanup: Any) -> None:
    vmid = cleanup(902)
    lxc = api.nodes(testbed.node).lxc
    wait_ok(
        api,
        testbed,
        lxc.post(vmid=vmid, ostemplate=testbed.template, storage=testbed.storage, unprivileged=1),
    )
    assert realct.exists(vmid)
    wait_ok(api, testbed, lxc(vmid).status.start.post())
    assert realct.state(vmid)[0] == "running"
    wait_ok(api, testbed, lxc(vmid).status.stop.post())
    assert realct.state(vmid)[0] == "stopped"
    wait_ok(api, testbed, lxc(vmid).delete())
    assert not Path(f"/var/lib/lxc/{vmid}").exists()
    try:
        lxc(vmid).status.current.get()
        raise AssertionError("the API still knows the destroyed container")
    except ResourceException as e:
        assert e.status_code == 500
        assert f"Configuration file 'nodes/{testbed.node}/lxc/{vmid}.conf' does not exist" in str(e.content)


def test_shutdown_is_clean(api: Any, testbed: client.Testbed, cleanup: Any) -> None:
    vmid = cleanup(903)
    lxc = api.nodes(testbed.node).lxc
    wait_ok(
        api,
        testbed,
        lxc.post(vmid=vmid, ostemplate=testbed.template, storage=testbed.storage, start=1, unprivileged=1),
    )
    assert realct.state(vmid)[0] == "running"
    wait_takes_halt(vmid)
    wait_ok(api, testbed, lxc(vmid).status.shutdown.post(timeout=30))
    assert realct.state(vmid)[0] == "stopped"
    assert lxc(vmid).status.current.get()["status"] == "stopped"


def test_privileged_container(api: Any, testbed: client.Testbed, cleanup: Any) -> None:
    vmid = cleanup(904)
    lxc = api.nodes(testbed.node).lxc
    wait_ok(
        api,
        testbed,
        lxc.post(vmid=vmid, ostemplate=testbed.template, storage=testbed.storage, unprivileged=0, start=1),
    )
    assert "lxc.idmap" not in Path(f"/var/lib/lxc/{vmid}/config").read_text()
    assert os.stat(f"/var/lib/lxc/{vmid}/rootfs/etc/passwd").st_uid == 0
    assert realct.state(vmid)[0] == "running"


def test_real_state_wins_over_api(api: Any, testbed: client.Testbed, cleanup: Any) -> None:
    """A container stopped behind the API's back reads as stopped."""
    vmid = cleanup(905)
    lxc = api.nodes(testbed.node).lxc
    wait_ok(api, testbed, lxc.post(vmid=vmid, ostemplate=testbed.template, storage=testbed.storage, start=1))
    run(["lxc-stop", "-n", str(vmid), "-k"])
    assert lxc(vmid).status.current.get()["status"] == "stopped"
