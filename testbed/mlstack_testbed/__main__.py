"""testbed up | status [--json] | down [--purge] | reboot NODE | packages [--tests]: one command for the
stand-in PVE node."""

import argparse
import json
import os
import secrets
import socket
import ssl
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from . import controller, paths
from .lxc import realct, rootfs
from .node import daemons, disk, gpu, host_setup, nodes, nvdriver, nvsmi, reboot, sshd
from .proc import report_up, say

API_MARKER = "mlstack_testbed.node.api"
PACKAGE = Path(__file__).parent
# What the API server runs: the shared modules, node and lxc (gpucheck is no part of it).
API_CODE = ("*.py", "node/*.py", "lxc/*.py")
CERT_MIN_DAYS = 3


# ------------------------------------------------------------------------- secrets


def ensure_password() -> None:
    f = paths.API_PASSWORD_FILE
    if not f.is_file() or not f.read_text().strip():
        fd = os.open(f, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(24) + "\n")
    f.chmod(0o600)


def cert_days_left() -> float:
    if not paths.API_CERT.is_file():
        return -1.0
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(paths.API_CERT.read_bytes())
    return (cert.not_valid_after_utc.timestamp() - time.time()) / 86400


def ensure_cert() -> bool:
    """A self-signed cert for 127.0.0.1 (fakepve's: 30 days); renewed when fewer than 3 days are left."""
    if cert_days_left() >= CERT_MIN_DAYS and paths.API_KEY.is_file():
        return False
    from fakepve.certs import make_cert

    make_cert(str(paths.TLS_DIR), name="api", hosts=(paths.API_HOST,))
    paths.API_CERT.chmod(0o644)
    return True


# ---------------------------------------------------------------------------- API


def api_pid() -> int | None:
    return daemons.pid_of(paths.API_PIDFILE, API_MARKER)


def api_ready(timeout: float = 2) -> bool:
    ctx = ssl.create_default_context(cafile=str(paths.API_CERT))
    url = f"https://{paths.API_HOST}:{paths.API_PORT}/api2/json/version"
    try:
        with urllib.request.urlopen(url, context=ctx, timeout=timeout) as r:
            return r.status in (200, 401)
    except urllib.error.HTTPError as e:
        return e.code == 401
    except OSError:
        return False


def code_changed_since(pidfile: Path, package: Path = PACKAGE) -> bool:
    """True when the testbed's Python code is newer than the process recorded in pidfile."""
    newest = max(p.stat().st_mtime for pattern in API_CODE for p in package.glob(pattern))
    return pidfile.is_file() and newest > pidfile.stat().st_mtime


def port_busy(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(1)
        return s.connect_ex((host, port)) == 0


def start_api() -> int:
    if port_busy(paths.API_HOST, paths.API_PORT):
        raise RuntimeError(
            f"{paths.API_HOST}:{paths.API_PORT} is in use by a process the testbed did not start"
        )
    env = dict(os.environ, PYTHONPATH=str(paths.TESTBED_DIR), MLSTACK_TESTBED_STATE=str(paths.STATE_DIR))
    pid = daemons.spawn(
        [sys.executable, "-m", API_MARKER], paths.API_PIDFILE, paths.LOG_DIR / "api.log", env=env
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if api_ready():
            return pid
        if not Path(f"/proc/{pid}").exists() or daemons.is_zombie(pid):
            break
        time.sleep(0.2)
    raise RuntimeError(f"the API server did not come up; see {paths.LOG_DIR / 'api.log'}")


# ----------------------------------------------------------------------- testbed.json


def write_testbed_json(gpu_nodes: list[str], cluster: list[nodes.Node]) -> dict[str, Any]:
    from fakepve.model import Model

    data = {
        "schema_version": 1,
        "api_host": paths.API_HOST,
        "api_port": paths.API_PORT,
        "node": paths.NODE,
        "api_user": paths.API_USER,
        "api_password_file": str(paths.API_PASSWORD_FILE),
        # The privilege-separated token the API server makes at start (least privilege).
        "api_token_id": paths.API_TOKEN_ID,
        "api_token_secret_file": str(paths.API_TOKEN_SECRET_FILE),
        "api_ca_file": str(paths.API_CERT),
        "ssh_host": paths.SSH_HOST,
        "ssh_port": paths.SSH_PORT,
        "ssh_user": paths.SSH_USER,
        "ssh_key_file": str(paths.SSH_CLIENT_KEY),
        "ssh_known_hosts_file": str(paths.SSH_KNOWN_HOSTS),
        "template": paths.TEMPLATE_VOLID,
        "storage": paths.STORAGE,
        "bridge": paths.BRIDGE,
        "host_bridge": paths.HOST_BRIDGE,
        "gpu_nodes": gpu_nodes,
        "gpu_model": nvsmi.current(),
        "driver_version": nvdriver.current(),
        "state_dir": str(paths.STATE_DIR),
        # The PVE version the API answers, for the nodes' `pveversion` (run on every preflight of a node;
        # importing fakepve there costs 0.2 s of CPU each time).
        "pve_version": Model().version,
        # The cluster's PVE nodes (the first is the one above), each its own SSH address and pct.
        "nodes": [{"name": n.name, "ssh_host": n.ssh_host, "ssh_port": n.ssh_port} for n in cluster],
    }
    tmp = paths.TESTBED_JSON.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.chmod(0o644)
    tmp.replace(paths.TESTBED_JSON)
    return data


# ------------------------------------------------------------------------- commands


def refuse_dropping_busy_nodes(previous: list[nodes.Node], cluster: list[nodes.Node]) -> None:
    """Fewer nodes than before: only when the nodes left out hold no container (PVE, too, removes a node
    from its cluster only once its guests are gone)."""
    dropped = {n.name for n in previous[len(cluster) :]}
    if not dropped:
        return
    held = [f"CT {c['vmid']} on {c['node']}" for c in paths.saved_cts() if c.get("node") in dropped]
    if held:
        raise RuntimeError(
            f"--nodes {len(cluster)} would drop {', '.join(sorted(dropped))}, which still hold(s) "
            f"{', '.join(held)}: destroy those first, or keep --nodes {len(previous)}"
        )


def ensure_node_sshd(node: nodes.Node, done: list[str], already: list[str], mounts_changed: bool) -> None:
    """The node's sshd running with its current stand-ins and the machine's mounts, and its host key pinned
    on the machine."""
    scripts_changed = sshd.prepare(node)
    if host_setup.install_known_host(sshd.known_hosts_line(node)):
        done.append(f"host key of {node.name} pinned in {paths.SYSTEM_KNOWN_HOSTS}")
    pid = sshd.running(node)
    if pid and (scripts_changed or mounts_changed):
        # Its mount namespace is a private copy: mounts made since it started never reach it.
        why = (
            "its /usr/sbin overlay gained or changed a stand-in"
            if scripts_changed
            else "the testbed's disk was mounted"
        )
        say(f"restarting sshd of {node.name} ({why})")
        sshd.stop(node)
        pid = None
    if pid:
        already.append(f"node {node.name}: sshd pid {pid} on {node.ssh_host}:{node.ssh_port}")
        return
    pid = sshd.start(node)
    time.sleep(0.3)
    if not sshd.running(node):
        raise RuntimeError(f"sshd of {node.name} did not stay up; see {node.log}")
    done.append(f"node {node.name}: sshd pid {pid} on {node.ssh_host}:{node.ssh_port}")


def cmd_up(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    if os.geteuid() != 0:
        say("must run as root")
        return 2
    # Bad --nodes changes nothing: refused before any step.
    if args.nodes is not None and not 1 <= args.nodes <= nodes.MAX_NODES:
        raise RuntimeError(f"--nodes {args.nodes}: a testbed cluster has 1 to {nodes.MAX_NODES} nodes")
    previous = nodes.cluster()
    cluster = nodes.cluster(args.nodes or len(previous))
    refuse_dropping_busy_nodes(previous, cluster)
    done: list[str] = []
    already: list[str] = []
    if host_setup.ensure_packages():
        done.append("packages")
    paths.ensure_dirs()
    if host_setup.ensure_subids():
        done.append("subuid/subgid")
    (done if host_setup.ensure_bridge() else already).append(f"bridge {paths.HOST_BRIDGE}")
    # Before anything is made in the folders it holds.
    try:
        disk_changed, disk_line = disk.testbed_disk().ensure()
    except RuntimeError as exc:
        say(f"{exc}: containers are made on the root filesystem (slower)")
        disk_changed, disk_line = False, "disk: not used (see the message above)"
    (done if disk_changed else already).append(disk_line)
    ensure_password()
    cert_new = ensure_cert()
    (done if rootfs.build_template() else already).append(f"template {paths.TEMPLATE_VOLID}")
    made_before = len(gpu.recorded()["created"])  # type: ignore[arg-type]
    gpu_nodes = gpu.ensure(args.gpu_nodes) if args.gpu_nodes else gpu.present()
    made = len(gpu.recorded()["created"]) - made_before  # type: ignore[arg-type]
    (done if made else already).append(f"gpu nodes: {len(gpu_nodes)} present, {made} made now")
    # No --gpu-model: the node answers as one without a driver (nvidia-smi exits 9).
    model_changed = nvsmi.select(args.gpu_model)
    (done if model_changed else already).append(f"gpu model: {args.gpu_model or 'none (no driver)'}")
    nodes_changed = nodes.record(len(cluster))
    sshd.prepare_client_key()
    for node in cluster:
        ensure_node_sshd(node, done, already, mounts_changed=disk_changed)
    sshd.pin_host_keys(cluster)
    # No --driver-version: no NVIDIA kernel module on the nodes (no /proc/driver/nvidia/version).
    driver_changed = nvdriver.select(args.driver_version, [sshd.running(n) for n in cluster])
    (done if driver_changed else already).append(f"driver: {args.driver_version or 'none'}")
    for node in previous[len(cluster) :]:
        pid = sshd.stop(node)
        host_setup.remove_known_host(node.known_hosts_name)
        done.append(f"node {node.name} removed (sshd pid {pid} stopped)")
    pid = api_pid()
    if pid and (cert_new or nodes_changed or code_changed_since(paths.API_PIDFILE)):
        say("restarting the API server (new certificate, other nodes or newer testbed code)")
        daemons.stop(paths.API_PIDFILE, API_MARKER)
        pid = None
    if pid and api_ready():
        already.append(f"API pid {pid} on https://{paths.API_HOST}:{paths.API_PORT}")
    else:
        if pid:
            daemons.stop(paths.API_PIDFILE, API_MARKER)
        pid = start_api()
        done.append(f"API pid {pid}")
    write_testbed_json(gpu_nodes, cluster)
    report_up(
        already, done, f"testbed up in {time.monotonic() - t0:.1f} s; connection info in {paths.TESTBED_JSON}"
    )
    return 0


def collect_status() -> dict[str, Any]:
    api = api_pid()
    cluster = nodes.cluster()
    ssh = {n.name: sshd.running(n) for n in cluster}
    cts = []
    for item in paths.saved_cts():
        real, pid = realct.state(int(item["vmid"]))
        cts.append(
            {
                "vmid": item["vmid"],
                "node": item.get("node", paths.FIRST_NODE),
                "hostname": item["config"].get("hostname"),
                "real": real,
                "pid": pid,
            }
        )
    return {
        "schema_version": 1,
        "up": bool(api and all(ssh.values()) and host_setup.bridge_up()),
        "debian": host_setup.debian_version(),
        "api": {
            "pid": api,
            "ready": bool(api) and api_ready(),
            "url": f"https://{paths.API_HOST}:{paths.API_PORT}",
            "node": paths.NODE,
        },
        "sshd": {"pid": ssh[paths.FIRST_NODE], "address": f"{paths.SSH_HOST}:{paths.SSH_PORT}"},
        "nodes": [
            {"name": n.name, "sshd_pid": ssh[n.name], "address": f"{n.ssh_host}:{n.ssh_port}"}
            for n in cluster
        ],
        "bridge": {
            "name": paths.HOST_BRIDGE,
            "up": host_setup.bridge_up(),
            "started_by_testbed": paths.LXC_NET_MARKER.is_file(),
        },
        "template": {"volid": paths.TEMPLATE_VOLID, **rootfs.template_status()},
        "disk": disk.testbed_disk().state(),
        "gpu_nodes": {
            "present": gpu.present(),
            "created_by_testbed": [c["path"] for c in gpu.recorded()["created"]],
        },  # type: ignore[attr-defined]
        "gpu_model": nvsmi.current(),
        "driver_version": nvdriver.current(),
        "containers": cts,
        "testbed_json": str(paths.TESTBED_JSON) if paths.TESTBED_JSON.is_file() else None,
    }


def cmd_status(args: argparse.Namespace) -> int:
    st = collect_status()
    if args.json:
        print(json.dumps(st, indent=2))
        return 0 if st["up"] else 1
    print(f"testbed: {'UP' if st['up'] else 'DOWN'} (Debian {st['debian']})")
    print(
        f"  API     {st['api']['url']} node {st['api']['node']}: "
        f"{'pid ' + str(st['api']['pid']) if st['api']['pid'] else 'not running'}"
        f"{'' if st['api']['ready'] or not st['api']['pid'] else ' (not answering)'}"
    )
    for node in st["nodes"]:
        print(
            f"  node {node['name']} sshd {node['address']}: "
            f"{'pid ' + str(node['sshd_pid']) if node['sshd_pid'] else 'not running'}"
        )
    print(f"  bridge  {st['bridge']['name']}: {'up' if st['bridge']['up'] else 'down'}")
    t = st["template"]
    print(
        f"  template {t['volid']}: "
        f"{'cached, ' + str(t['size'] // 2**20) + ' MiB' if t['present'] else 'not built'}"
        f"{' (CA certificates changed since built)' if t.get('stale_ca') else ''}"
    )
    for folder, where in st["disk"]["folders"].items():
        print(f"  folder  {folder}: {where}")
    print(f"  gpu nodes: {', '.join(st['gpu_nodes']['present']) or 'none'}")
    print(f"  gpu model (nvidia-smi): {st['gpu_model'] or 'none (no driver)'}")
    print(f"  driver (/proc/driver/nvidia/version): {st['driver_version'] or 'none'}")
    for ct in st["containers"]:
        print(f"  CT {ct['vmid']} {ct['hostname']} on {ct['node']}: {ct['real']}")
    return 0 if st["up"] else 1


def testbed_vmids() -> list[int]:
    """Containers of the testbed: those in its API state, and real ones carrying its config header."""
    vmids = set()
    vmids |= {int(c["vmid"]) for c in paths.saved_cts()}
    for d in paths.LXC_PATH.glob("*/config") if paths.LXC_PATH.is_dir() else []:
        first = d.read_text(errors="replace").split("\n", 1)[0]
        if d.parent.name.isdigit() and realct.ORIGIN in first:
            vmids.add(int(d.parent.name))
    return sorted(vmids)


# The nodes' shared uv store: the gpu_container role's default (one folder for every testbed node, as the
# nodes share this machine's /var/lib/mlstack). A container's venvs are its venvs/ct<vmid>/ there.
ROLE_DEFAULTS = Path(__file__).resolve().parents[2] / "roles" / "gpu_container" / "defaults" / "main.yml"


def node_venvs_dir(vmid: int) -> Path:
    """Where a container's venvs live in the nodes' uv store (gpu_container_uv_cache_dir/venvs/ct<vmid>)."""
    import yaml

    store = yaml.safe_load(ROLE_DEFAULTS.read_text())["gpu_container_uv_cache_dir"]
    return Path(store) / "venvs" / f"ct{vmid}"


def remove_venvs(vmid: int) -> str:
    """Remove a destroyed container's venvs from the nodes' uv store, as destroy.yml does on a real node
    (uv's cache stays: the other containers' venvs are hard links into it). Says what it removed."""
    import shutil

    folder = node_venvs_dir(vmid)
    if not folder.is_dir():
        return ""
    shutil.rmtree(folder)
    return f"its venvs {folder} removed"


def cmd_down(args: argparse.Namespace) -> int:
    pid = daemons.stop(paths.API_PIDFILE, API_MARKER)
    print(f"API: {'stopped pid ' + str(pid) if pid else 'was not running'}")
    cluster = nodes.cluster()
    for node in cluster:
        pid = sshd.stop(node)
        print(f"sshd of {node.name}: {'stopped pid ' + str(pid) if pid else 'was not running'}")
    for vmid in testbed_vmids():
        if args.purge:
            realct.destroy(vmid)
            venvs = remove_venvs(vmid)
            print(f"CT {vmid}: destroyed{'; ' + venvs if venvs else ''}")
        elif realct.state(vmid)[0] == "running":
            realct.stop(vmid, timeout=10)
            print(f"CT {vmid}: stopped")
    if host_setup.stop_bridge():
        print(f"bridge {paths.HOST_BRIDGE}: stopped (lxc-net stop)")
    removed = gpu.remove_created()
    if removed:
        print(f"gpu nodes removed: {', '.join(removed)}")
    if args.purge:
        rootfs.remove_template()
        # The testbed's disk stays (it holds uv's cache); what it holds in the state dir is let go first.
        for folder in disk.testbed_disk().release(paths.STATE_DIR):
            print(f"{folder}: unmounted from the testbed's disk")
        for node in cluster:
            host_setup.remove_known_host(node.known_hosts_name)
        import shutil

        shutil.rmtree(paths.STATE_DIR, ignore_errors=True)
        print(f"purged {paths.STATE_DIR} (template, keys, API state) and the pinned host key")
    return 0


def cmd_reboot(args: argparse.Namespace) -> int:
    return reboot.reboot(args.node, args.all_gpu_nodes, args.module_missing)


def cmd_packages(args: argparse.Namespace) -> int:
    wanted = host_setup.PACKAGES + (host_setup.TEST_PACKAGES if args.tests else ())
    missing = host_setup.missing_packages(wanted)
    if missing and os.geteuid() != 0:
        say(f"must run as root to install {' '.join(missing)}")
        return 2
    installed = host_setup.ensure_packages(wanted)
    say(f"installed: {' '.join(installed)}" if installed else f"already installed: {' '.join(wanted)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testbed", description=__doc__)
    sub = parser.add_subparsers(dest="cmd", required=True)
    up = sub.add_parser("up", help="bring the testbed up (idempotent)")
    up.add_argument(
        "--gpu-nodes",
        type=int,
        default=0,
        metavar="N",
        help="also create N dummy /dev/nvidiaN nodes (+ ctl, uvm, caps) where absent",
    )
    up.add_argument(
        "--nodes",
        type=int,
        default=None,
        metavar="N",
        help="PVE nodes in the cluster: testbed, testbed2, ... (each its own sshd on 127.0.0.K and its own "
        "pct; one API); default: as many as the last `up` made, 1 at first",
    )
    up.add_argument(
        "--gpu-model",
        choices=nvsmi.models(),
        default=None,
        metavar="NAME",
        help="the node's nvidia-smi replays tests/data/nvidia-smi/NAME.csv "
        f"({', '.join(nvsmi.models())}); without it, it answers as a node without a driver",
    )
    up.add_argument(
        "--driver-version",
        type=nvdriver.version_arg,
        default=None,
        metavar="V",
        help="the nodes report NVIDIA kernel module V loaded (/proc/driver/nvidia/version, nvidia-smi's "
        "driver_version); without it, no driver",
    )
    st = sub.add_parser("status", help="what runs; exit 0 when up")
    st.add_argument("--json", action="store_true")
    down = sub.add_parser("down", help="stop what the testbed started (by PID)")
    down.add_argument("--purge", action="store_true", help="also destroy its containers, template and state")
    rb = sub.add_parser(
        "reboot",
        help="reboot a node as its containers see it: stopped, uvm nodes gone, boot units, onboot started",
    )
    rb.add_argument("node", metavar="NODE", help="the node: testbed, testbed2, ...")
    rb.add_argument(
        "--all-gpu-nodes",
        action="store_true",
        help="also remove /dev/nvidiaN and nvidiactl (a driver install without udev rules)",
    )
    rb.add_argument(
        "--module-missing",
        action="store_true",
        help="the node's NVIDIA kernel module cannot load (its nvidia-modprobe fails) until a plain reboot",
    )
    pk = sub.add_parser("packages", help="install the machine's packages `up` needs (idempotent), only those")
    pk.add_argument("--tests", action="store_true", help="and those `make test`'s suites need")
    ctl = sub.add_parser(
        "controller",
        help="a second Ansible controller, the stack beside .venv's (testbed/README.md): up|run|down",
    )
    controller.add_arguments(ctl)
    args = parser.parse_args(argv)
    commands = {
        "up": cmd_up,
        "status": cmd_status,
        "down": cmd_down,
        "reboot": cmd_reboot,
        "packages": cmd_packages,
        "controller": controller.cmd,
    }
    try:
        return commands[args.cmd](args)
    except RuntimeError as e:
        say(f"error: {e}")
        return 1


if __name__ == "__main__":
    sys.exit(main())
