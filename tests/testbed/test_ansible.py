"""The project's Ansible pieces against the testbed: community.proxmox.proxmox through the API, and the
two container connections (mlstack.pve.pct_ssh, community.proxmox.proxmox_pct_remote) through the
testbed's sshd and pct."""

import json
import uuid
from pathlib import Path
from typing import Any

import pytest
from mlstack_testbed import client
from mlstack_testbed.lxc import realct
from tbhelpers import LOCAL_INVENTORY, api_args, attach, playbook, results, run

PCT_SSH, PCT_REMOTE = "mlstack.pve.pct_ssh", "community.proxmox.proxmox_pct_remote"


def pct_inventory(testbed: client.Testbed, vmid: int, connection: str = PCT_REMOTE, **hostvars: Any) -> str:
    return json.dumps(
        {
            "all": {
                "hosts": {
                    f"ct{vmid}": {
                        "ansible_host": testbed.ssh_host,
                        "ansible_port": testbed.ssh_port,
                        "ansible_user": testbed.ssh_user,
                        "ansible_connection": connection,
                        "ansible_private_key_file": testbed.ssh_key_file,
                        "ansible_ssh_common_args": f"-o UserKnownHostsFile={testbed.ssh_known_hosts_file}",
                        "mlstack_ssh_known_hosts_file": testbed.ssh_known_hosts_file,
                        "proxmox_vmid": vmid,
                        "ansible_python_interpreter": "/usr/bin/python3",
                        **hostvars,
                    }
                }
            }
        }
    )


def test_proxmox_module_create_is_idempotent(
    testbed: client.Testbed, ansible_env: dict[str, str], tmp_path: Path, cleanup: Any
) -> None:
    vmid = cleanup(930)
    task = {
        "community.proxmox.proxmox": {
            **api_args(testbed),
            "node": testbed.node,
            "vmid": vmid,
            "hostname": f"ans{vmid}",
            "ostemplate": testbed.template,
            "storage": testbed.storage,
            "unprivileged": True,
            "cores": 1,
            "memory": 512,
            "netif": {"net0": "name=eth0,bridge=vmbr0,ip=dhcp"},
            "state": "present",
        },
        "no_log": True,
    }
    plays = json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": [task, task]}])
    out = playbook(ansible_env, tmp_path, LOCAL_INVENTORY, plays)
    first, second = results(out, "localhost")
    assert not first.get("failed") and first["changed"] is True, first
    assert not second.get("failed") and second["changed"] is False, second
    assert realct.exists(vmid)
    assert f"lxc.uts.name = ans{vmid}" in Path(f"/var/lib/lxc/{vmid}/config").read_text()


@pytest.mark.parametrize("connection", [PCT_SSH, PCT_REMOTE])
def test_container_connection_playbook(
    testbed: client.Testbed,
    ansible_env: dict[str, str],
    tmp_path: Path,
    ct900: dict[str, Any],
    connection: str,
) -> None:
    """The bootstrap-then-modules flow provisioning uses: raw (safely), copy (put_file), command, fetch."""
    wait_net = (
        "for i in $(seq 30); do ip -4 -o addr show eth0 | grep -q inet && exit 0; sleep 1; done; exit 1"
    )
    assert attach(900, wait_net, timeout=40).returncode == 0
    fetched = tmp_path / "fetched"
    plays = json.dumps(
        [
            {
                "hosts": "ct900",
                "gather_facts": False,
                "tasks": [
                    {
                        "name": "Bootstrap python3",
                        "ansible.builtin.raw": "command -v python3 || "
                        "(apt-get update -qq && "
                        "DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-minimal)",
                        "args": {"executable": "/bin/sh"},
                        "changed_when": False,
                    },
                    {
                        "ansible.builtin.copy": {
                            "content": "from ansible\n",
                            "dest": "/root/from-ansible.txt",
                            "mode": "0600",
                        }
                    },
                    {
                        "ansible.builtin.command": {"cmd": "cat /root/from-ansible.txt"},
                        "register": "cat",
                        "changed_when": False,
                    },
                    {
                        "ansible.builtin.fetch": {
                            "src": "/root/from-ansible.txt",
                            "dest": f"{fetched}/",
                            "flat": False,
                        }
                    },
                ],
            }
        ]
    )
    out = playbook(ansible_env, tmp_path, pct_inventory(testbed, 900, connection), plays, timeout=400)
    res = results(out, "ct900")
    assert all(not r.get("failed") and not r.get("unreachable") for r in res), res
    assert res[2]["stdout"] == "from ansible"
    assert attach(900, "stat -c %a /root/from-ansible.txt").stdout.strip() == "600"
    assert (fetched / "ct900" / "root" / "from-ansible.txt").read_text() == "from ansible\n"


@pytest.mark.parametrize(
    ("connection", "args", "on_host"),
    [
        (PCT_REMOTE, {}, True),
        (PCT_REMOTE, {"executable": "/bin/sh"}, False),
        (PCT_SSH, {}, False),
        (PCT_SSH, {"executable": "/bin/sh"}, False),
    ],
    ids=[
        "pct_remote-plain-raw-reaches-host",
        "pct_remote-sh-inside",
        "pct_ssh-plain-inside",
        "pct_ssh-sh-inside",
    ],
)
def test_raw_semicolon(
    testbed: client.Testbed,
    ansible_env: dict[str, str],
    tmp_path: Path,
    ct900: dict[str, Any],
    connection: str,
    args: dict[str, str],
    on_host: bool,
) -> None:
    """proxmox_pct_remote sends `/usr/sbin/pct exec <vmid> -- <cmd>` unquoted: with plain raw, whatever
    follows a `;` runs ON THE PVE HOST. With `args: executable: /bin/sh`, Ansible wraps the command in
    `/bin/sh -c '...'` and all of it runs in the container. pct_ssh quotes the whole command into the
    container's sh, so plain raw stays inside too."""
    marker = f"/tmp/mlstack-raw-{uuid.uuid4().hex}"
    task: dict[str, Any] = {"ansible.builtin.raw": f"true; touch {marker}"}
    if args:
        task["args"] = args
    plays = json.dumps([{"hosts": "ct900", "gather_facts": False, "tasks": [task]}])
    try:
        out = playbook(ansible_env, tmp_path, pct_inventory(testbed, 900, connection), plays)
        assert not results(out, "ct900")[0].get("failed")
        assert Path(marker).exists() is on_host
        assert (attach(900, f"test -e {marker}").returncode == 0) is (not on_host)
    finally:
        Path(marker).unlink(missing_ok=True)


def test_pct_ssh_refuses_a_node_with_another_host_key(
    testbed: client.Testbed, ansible_env: dict[str, str], tmp_path: Path, ct900: dict[str, Any]
) -> None:
    """The pinned known_hosts is checked even when ssh_common_args name another file holding the real key."""
    r = run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "impostor")])
    assert r.returncode == 0, r.stderr
    kind, key = (tmp_path / "impostor.pub").read_text().split()[:2]
    pinned = tmp_path / "pinned_known_hosts"
    pinned.write_text(f"[{testbed.ssh_host}]:{testbed.ssh_port} {kind} {key}\n")
    inventory = pct_inventory(
        testbed,
        900,
        PCT_SSH,
        mlstack_ssh_known_hosts_file=str(pinned),
        mlstack_ssh_control_path_dir=str(tmp_path / "cp"),
    )
    plays = json.dumps([{"hosts": "ct900", "gather_facts": False, "tasks": [{"ansible.builtin.ping": {}}]}])
    res = results(playbook(ansible_env, tmp_path, inventory, plays), "ct900")
    assert res[0].get("unreachable"), res[0].get("msg")
    assert "Host key verification failed" in res[0]["msg"] or "IDENTIFICATION HAS CHANGED" in res[0]["msg"]


def test_pct_ssh_exit_255_inside_is_a_failure_not_unreachable(
    testbed: client.Testbed, ansible_env: dict[str, str], tmp_path: Path, ct900: dict[str, Any]
) -> None:
    """OpenSSH exits 255 for its own errors; a command in the container that exits 255 is still the
    command's failure, with its own output."""
    task = {"ansible.builtin.raw": "echo said-inside >&2; exit 255", "args": {"executable": "/bin/sh"}}
    plays = json.dumps([{"hosts": "ct900", "gather_facts": False, "tasks": [task]}])
    res = results(playbook(ansible_env, tmp_path, pct_inventory(testbed, 900, PCT_SSH), plays), "ct900")
    assert res[0].get("failed") and not res[0].get("unreachable"), res
    assert res[0]["rc"] == 255 and "said-inside" in res[0]["stderr"]
