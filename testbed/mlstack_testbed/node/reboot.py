"""`testbed reboot NODE`: what a PVE node's reboot does to its containers and GPU device nodes.

1. The node's running containers are stopped through the API (a hard stop; PVE shuts them down).
2. The NVIDIA nodes a boot does not make by itself are removed: /dev/nvidia-uvm and -uvm-tools (nothing
   makes them until something loads nvidia-uvm), with `all_gpu_nodes` also /dev/nvidiaN and nvidiactl
   (driver installs without udev rules). Only those the testbed made, so they come back with the same
   numbers (the node's stand-in nvidia-modprobe, or gpu.restore_created()). The nodes are the machine's:
   every testbed node sees the change.
3. With `module_missing` the node's NVIDIA kernel module cannot load until its next plain reboot (its
   nvidia-modprobe fails as modprobe does after a kernel update without the module rebuilt).
4. The node's enabled systemd services ordered Before=pve-guests.service (/etc/systemd/system, linked
   from a *.wants folder as `systemctl enable` links them) run as systemd runs them at boot: each
   ExecStart= in order, in the node's own mount namespace, dependencies among them first (After=).
5. The containers with onboot=1 start in PVE's startup order (startup's order=, then vmid) through the
   API's start, the path pve-guests takes, so their hookscripts run. A start that fails is reported with
   its task log, and the next one is started, as pve-guests does.
"""

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import client
from ..proc import run
from . import gpu, nodes, sshd

UNIT_DIR = Path("/etc/systemd/system")
GUESTS_UNIT = "pve-guests.service"


@dataclass
class Unit:
    name: str
    exec_start: list[str]
    after: set[str] = field(default_factory=set)


def parse_unit(text: str) -> dict[str, list[str]]:
    """A unit file's `Section.Key` -> its values in order (a key may come again: ExecStart= of a oneshot)."""
    out: dict[str, list[str]] = {}
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, sep, value = line.partition("=")
        if sep:
            out.setdefault(f"{section}.{key.strip()}", []).append(value.strip())
    return out


def _words(unit: dict[str, list[str]], key: str) -> set[str]:
    return {w for value in unit.get(key, []) for w in value.split()}


def boot_units(unit_dir: Path = UNIT_DIR) -> list[Unit]:
    """Enabled services ordered before pve-guests, in the order systemd would run them."""
    enabled = {p.name for p in unit_dir.glob("*.wants/*.service")}
    units: dict[str, Unit] = {}
    for name in sorted(enabled):
        path = unit_dir / name
        if not path.is_file():
            continue
        parsed = parse_unit(path.read_text())
        if GUESTS_UNIT not in _words(parsed, "Unit.Before"):
            continue
        execs = [v for v in parsed.get("Service.ExecStart", []) if v]
        units[name] = Unit(name, execs, _words(parsed, "Unit.After"))
    ordered: list[Unit] = []
    while units:
        ready = sorted(n for n, u in units.items() if not (u.after & set(units) - {n}))
        for n in ready or sorted(units)[:1]:
            ordered.append(units.pop(n))
    return ordered


def run_unit(unit: Unit, node: nodes.Node) -> tuple[bool, list[str]]:
    """Its ExecStart lines in the node's mount namespace; (ok, output lines). A '-' prefix: failure
    ignored, as systemd does."""
    pid = sshd.running(node)
    if pid is None:
        return False, [f"node {node.name} has no sshd running: `testbed up` first"]
    lines: list[str] = []
    for line in unit.exec_start:
        ignore = line.lstrip().startswith("-")
        argv = shlex.split(line.strip().lstrip("-@+!:"))
        r = run(["nsenter", "-t", str(pid), "-m", "--", *argv], timeout=300)
        lines += [s for s in (r.out + r.err).splitlines() if s.strip()]
        if not r.ok and not ignore:
            lines.append(f"{unit.name}: {argv[0]} failed (exit {r.rc})")
            return False, lines
    return True, lines


def start_order(cts: list[dict[str, Any]], configs: dict[int, dict[str, Any]]) -> list[int]:
    """The onboot containers in pve-guests' order: startup's order= first (ascending), then by vmid."""

    def order(vmid: int) -> tuple[int, int]:
        props = dict(p.split("=", 1) for p in str(configs[vmid].get("startup", "")).split(",") if "=" in p)
        value = props.get("order", "")
        return (int(value) if value.isdigit() else 2**31, vmid)

    onboot = [int(c["vmid"]) for c in cts if str(configs[int(c["vmid"])].get("onboot", 0)) == "1"]
    return sorted(onboot, key=order)


def reboot(name: str, all_gpu_nodes: bool = False, module_missing: bool = False) -> int:
    """Reboot node `name` as above; prints each step. 0 when every onboot container started."""
    node = next((n for n in nodes.cluster() if n.name == name), None)
    if node is None:
        raise RuntimeError(f"no node {name!r}: the cluster is {', '.join(n.name for n in nodes.cluster())}")
    api = client.load().proxmox()
    lxc = api.nodes(name).lxc
    cts = lxc.get()
    for ct in sorted(cts, key=lambda c: int(c["vmid"])):
        if ct.get("status") == "running":
            client.wait_task(api, name, lxc(ct["vmid"]).status.stop.post())
            print(f"stopped CT {ct['vmid']}")
    for path in gpu.remove_for_reboot(all_gpu_nodes):
        print(f"removed {path}")
    marker = gpu.module_missing_marker(name)
    if module_missing:
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("the NVIDIA kernel module is not built for this kernel\n")
        print(f"{name}: the NVIDIA kernel module cannot load until its next plain reboot")
    else:
        marker.unlink(missing_ok=True)
    units = boot_units()
    if not units:
        print(f"no enabled unit ordered before {GUESTS_UNIT}")
    for unit in units:
        ok, lines = run_unit(unit, node)
        for line in lines:
            print(f"{unit.name}: {line}")
        print(f"{unit.name}: {'done' if ok else 'failed'}")
    configs = {int(c["vmid"]): lxc(c["vmid"]).config.get() for c in cts}
    failed = []
    for vmid in start_order(cts, configs):
        upid = lxc(vmid).status.start.post()
        status = client.wait_task(api, name, upid)
        if status.get("exitstatus") == "OK":
            print(f"started CT {vmid}")
            continue
        failed.append(vmid)
        print(f"CT {vmid} did not start: {status.get('exitstatus')}")
        for line in client.task_log(api, name, upid):
            print(f"  {line}")
    print(f"{name} rebooted" + (f": {len(failed)} onboot container(s) did not start" if failed else ""))
    return 1 if failed else 0
