"""The `testbed` command: idempotent up, status, the contract in testbed.json, and an API restart."""

import json
import os
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from mlstack_testbed import client, paths
from tbhelpers import REPO, run, ssh

TESTBED = str(REPO / "testbed" / "testbed")
KEYS = {
    "api_host": "127.0.0.1",
    "api_port": 8006,
    "node": "testbed",
    "api_user": "root@pam",
    "ssh_host": "127.0.0.1",
    "ssh_port": 2222,
    "ssh_user": "root",
    "template": "local:vztmpl/debian-12-testbed_amd64.tar.zst",
    "storage": "local",
    "bridge": "vmbr0",
}


def test_up_is_idempotent_and_fast(testbed: client.Testbed) -> None:
    t0 = time.monotonic()
    r = run([TESTBED, "up"], timeout=120)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 10
    assert "already up: API pid" in r.stdout and "already up: node testbed: sshd pid" in r.stdout


def test_status_json(testbed: client.Testbed) -> None:
    r = run([TESTBED, "status", "--json"])
    assert r.returncode == 0
    st = json.loads(r.stdout)
    assert st["up"] and st["api"]["ready"] and st["template"]["present"]
    assert st["sshd"]["pid"] and st["bridge"]["up"]


def test_status_human(testbed: client.Testbed) -> None:
    r = run([TESTBED, "status"])
    assert r.returncode == 0 and r.stdout.startswith("testbed: UP")


def test_testbed_json_contract(testbed: client.Testbed) -> None:
    data = json.loads(paths.TESTBED_JSON.read_text())
    for key, value in KEYS.items():
        assert data[key] == value, key
    assert stat.S_IMODE(os.stat(data["api_password_file"]).st_mode) == 0o600
    assert Path(data["api_ca_file"]).read_text().startswith("-----BEGIN CERTIFICATE-----")
    assert Path(data["ssh_key_file"]).is_file()
    # One pinned line per node of the cluster, each also in the system file (paramiko reads only that).
    lines = Path(data["ssh_known_hosts_file"]).read_text().splitlines()
    assert lines[0].startswith("[127.0.0.1]:2222 ssh-ed25519 ")
    assert [ln.split()[0] for ln in lines] == [f"[{n['ssh_host']}]:{n['ssh_port']}" for n in data["nodes"]]
    system = Path("/etc/ssh/ssh_known_hosts").read_text().splitlines()
    assert all(line in system for line in lines)
    assert "/dev/nvidia0" in data["gpu_nodes"] and "/dev/nvidiactl" in data["gpu_nodes"]


def test_tls_is_verifiable_with_the_ca_file(testbed: client.Testbed) -> None:
    url = f"https://{testbed.api_host}:{testbed.api_port}/api2/json/version"
    assert requests.get(url, verify=testbed.api_ca_file, timeout=10).status_code == 401
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(url, verify=True, timeout=10)


@pytest.mark.parametrize(
    "path",
    [
        "/dev/nvidia0",
        "/dev/nvidia1",
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
    ],
)
def test_dummy_gpu_nodes(testbed: client.Testbed, path: str) -> None:
    st = os.stat(path)
    assert stat.S_ISCHR(st.st_mode)
    if path.startswith("/dev/nvidia") and path[11:].isdigit():
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (195, int(path[11:]))
    with pytest.raises(OSError) as err:
        os.open(path, os.O_RDONLY)
    assert err.value.errno == 6  # ENXIO: no driver behind the node


@pytest.mark.parametrize("sig", [15, 9], ids=["SIGTERM", "SIGKILL"])
def test_api_state_survives_restart(
    testbed: client.Testbed, api: Any, ct900: dict[str, Any], sig: int
) -> None:
    """Kill the API server (by its pidfile), bring the testbed up again: CT 900 is known, config and all,
    its status is the real one, and the session's login ticket is still good (as PVE's are)."""
    pid = int(paths.API_PIDFILE.read_text())
    os.kill(pid, sig)
    for _ in range(100):
        if not Path(f"/proc/{pid}").exists():
            break
        time.sleep(0.1)
    r = subprocess.run([TESTBED, "up"], capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 0, r.stderr
    assert "started/made: API pid" in r.stdout
    ct = api.nodes(testbed.node).lxc(900)
    assert ct.config.get()["dev0"] == "/dev/nvidia0,gid=44,mode=0666"
    assert ct.status.current.get()["status"] == "running"


QUERY = "nvidia-smi --query-gpu=index,name,uuid,compute_cap --format=csv,noheader"


@pytest.fixture
def gpu_model_restored(testbed: client.Testbed) -> Any:
    """The GPU model is the testbed's global state: back to no driver (the session's `up`) afterwards."""
    yield
    r = run([TESTBED, "up", "--gpu-nodes", "2"], timeout=120)
    assert r.returncode == 0, r.stderr


def test_gpu_model_replays_a_recorded_answer_over_ssh(
    testbed: client.Testbed, gpu_model_restored: Any
) -> None:
    r = run([TESTBED, "up", "--gpu-nodes", "2", "--gpu-model", "h200"], timeout=120)
    assert r.returncode == 0, r.stderr
    answer = ssh(testbed, QUERY)
    assert answer.returncode == 0, answer.stderr
    recorded = (REPO / "tests" / "data" / "nvidia-smi" / "h200.csv").read_text()
    assert answer.stdout == recorded
    assert answer.stdout.splitlines()[0].startswith("0, NVIDIA H200, GPU-") and answer.stdout.count("\n") == 8
    st = json.loads(run([TESTBED, "status", "--json"]).stdout)
    assert st["gpu_model"] == "h200"
    # The machine itself has no such nvidia-smi: only the node's SSH namespace shows it.
    assert not Path("/usr/sbin/nvidia-smi").exists()


def test_without_gpu_model_the_node_has_no_driver(testbed: client.Testbed, gpu_model_restored: Any) -> None:
    run([TESTBED, "up", "--gpu-nodes", "2", "--gpu-model", "b200"], timeout=120)
    r = run([TESTBED, "up", "--gpu-nodes", "2"], timeout=120)
    assert r.returncode == 0, r.stderr
    answer = ssh(testbed, QUERY)
    assert answer.returncode == 9
    assert "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver" in answer.stdout
    assert json.loads(run([TESTBED, "status", "--json"]).stdout)["gpu_model"] is None


def test_unknown_gpu_model_is_refused(testbed: client.Testbed) -> None:
    r = run([TESTBED, "up", "--gpu-model", "not-a-gpu"], timeout=120)
    assert r.returncode == 2 and "h200" in r.stderr
