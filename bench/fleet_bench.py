#!/usr/bin/env python3
"""Fleet speed benchmark on the testbed: mlstack.pve.pct_ssh against community.proxmox.proxmox_pct_remote,
and one node against a cluster of three, every figure measured in one run, ratios printed.

  .venv/bin/python bench/fleet_bench.py [--calls 20] [--skip-fleet] [--json out.json] [--logs DIR]

Needs the testbed up with 3 nodes (`make testbed`). Uses vmids 190-197, destroyed at the end, and the
node's shared uv cache as it is (a warm machine: run it after `make provision` or the suites). Figures:
- per-call cost of each layer under a task: lxc-attach on the machine (what pct exec does), one
  command over a kept SSH connection to the node, `pct exec` over that connection;
- per-task cost inside a container (a playbook of N stat tasks minus one of 1), per transport;
- first provision of 1 node x 2 containers (warm machine, new transport), then the changed=0 rerun: as it
  runs by default (pct_ssh, the doctor's fast tier on an unchanged stack), and with the doctor in full over
  each transport (pct_remote with the doctor in full is the rerun before both changes);
- first provision and changed=0 rerun of 3 nodes x 2 containers in one run (the fleet report of that run
  is kept with --logs), against 1 node x 2;
- for every playbook run, the CPU it cost: the whole machine's (/proc/stat: controller, nodes' sshd and
  pct, containers) and the controller's (ansible-playbook and the processes it waited for). On the
  testbed every node shares this machine's cores; machine CPU / cores is the least wall time a run can take.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "provision"))
sys.path.insert(0, str(REPO / "testbed"))

from ab import children_cpu  # noqa: E402
from mlstack_testbed import client  # noqa: E402
from playbook_runner import PlaybookRun, container, make_runner  # noqa: E402

VMIDS = (196, 197)
FLEET = {"testbed": [190, 191], "testbed2": [192, 193], "testbed3": [194, 195]}
TRANSPORTS = {"pct_ssh": "mlstack.pve.pct_ssh", "pct_remote": "community.proxmox.proxmox_pct_remote"}
LOGS: Path | None = None


def median_seconds(argv: list[str], calls: int) -> float:
    times = []
    for _ in range(calls):
        t0 = time.monotonic()
        r = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
        times.append(time.monotonic() - t0)
        if r.returncode != 0:
            sys.exit(f"{' '.join(argv)} failed: {r.stderr}")
    return statistics.median(times)


def layer_costs(tb: client.Testbed, vmid: int, calls: int, control_dir: Path) -> dict[str, float]:
    ssh = [
        "ssh", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
        "-o", f"UserKnownHostsFile={tb.ssh_known_hosts_file}",
        "-o", "ControlMaster=auto", "-o", "ControlPersist=60", "-o", f"ControlPath={control_dir}/%C",
        "-i", tb.ssh_key_file, "-p", str(tb.ssh_port), "-l", tb.ssh_user, tb.ssh_host,
    ]  # fmt: skip
    subprocess.run([*ssh, "true"], capture_output=True, timeout=60, check=True)  # the master
    return {
        "lxc_attach_s": median_seconds(
            ["lxc-attach", "-n", str(vmid), "--clear-env", "--", "/bin/true"], calls
        ),
        "ssh_kept_s": median_seconds([*ssh, "true"], calls),
        "ssh_pct_exec_s": median_seconds([*ssh, f"/usr/sbin/pct exec {vmid} -- /bin/true"], calls),
    }


def task_cost(tb: client.Testbed, work: Path, transport: str, vmid: int, tasks: int) -> float:
    """Seconds per task inside the container: a playbook of `tasks` stat tasks minus one of 1."""
    inventory = work / f"ct-{transport.rsplit('.', 1)[-1]}.json"
    inventory.write_text(
        json.dumps(
            {
                "all": {
                    "hosts": {
                        "ct": {
                            "ansible_connection": transport,
                            "ansible_host": tb.ssh_host,
                            "ansible_port": tb.ssh_port,
                            "ansible_user": tb.ssh_user,
                            "ansible_ssh_private_key_file": tb.ssh_key_file,
                            "mlstack_ssh_known_hosts_file": tb.ssh_known_hosts_file,
                            "proxmox_vmid": vmid,
                            "ansible_python_interpreter": "/usr/bin/python3",
                        }
                    }
                }
            }
        )
    )
    wall = {}
    for n in (1, tasks):
        play = work / f"stat-{n}.yml"
        stats = [{"ansible.builtin.stat": {"path": "/etc/hostname"}} for _ in range(n)]
        play.write_text(json.dumps([{"hosts": "ct", "gather_facts": False, "tasks": stats}]))
        t0 = time.monotonic()
        r = subprocess.run(
            [str(REPO / ".venv" / "bin" / "ansible-playbook"), "-i", str(inventory), str(play)],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
            env={"ANSIBLE_CONFIG": str(REPO / "ansible.cfg"), "PATH": "/usr/bin:/bin", "HOME": "/root"},
        )
        wall[n] = time.monotonic() - t0
        if r.returncode != 0:
            sys.exit(f"stat tasks over {transport} failed:\n{r.stdout[-3000:]}")
    return (wall[tasks] - wall[1]) / (tasks - 1)


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine has spent busy (all cores, /proc/stat): controller, nodes, containers."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def controller_seconds() -> float:
    """CPU seconds of finished child processes: ansible-playbook and what it waited for (its forks, ssh)."""
    return children_cpu()


CPU: dict[str, dict[str, float]] = {}


def timed(runner: Any, playbook: str, cts: Any, label: str, **extra: Any) -> tuple[float, PlaybookRun]:
    """One playbook run: wall seconds, and (in CPU) the CPU it cost the machine and the controller."""
    busy0, ctl0, t0 = machine_busy_seconds(), controller_seconds(), time.monotonic()
    run = runner(playbook, cts, timeout=3600, **extra)
    elapsed = time.monotonic() - t0
    busy, ctl = machine_busy_seconds() - busy0, controller_seconds() - ctl0
    CPU[label] = {"wall_s": elapsed, "machine_cpu_s": busy, "controller_cpu_s": ctl}
    if LOGS:
        (LOGS / f"{label}.log").write_text(run.output)
    if run.rc != 0:
        sys.exit(f"{label} failed (rc {run.rc}):\n{run.output[-4000:]}")
    print(
        f"  {label:<28} {elapsed:7.1f} s  changed={run.changed()}  CPU: machine {busy:6.1f} s,"
        f" controller {ctl:6.1f} s",
        flush=True,
    )
    return elapsed, run


def fleet_containers() -> dict[str, list[dict[str, Any]]]:
    return {node: [container(v) for v in vmids] for node, vmids in FLEET.items()}


def fleet(runner: Any, work: Path) -> dict[str, Any]:
    """3 nodes x 2 containers: first provision and changed=0 rerun, each one run of provision.yml."""
    cts = fleet_containers()
    reports = work / "fleet-reports"
    runner("destroy.yml", cts, mlstack_destroy_confirm=True)
    print("provisioning 3 nodes x 2 containers (warm machine):", flush=True)
    first, _ = timed(runner, "provision.yml", cts, "fleet first provision", fleet_report_dir=str(reports))
    rerun, run = timed(runner, "provision.yml", cts, "fleet rerun", fleet_report_dir=str(reports))
    if LOGS:
        for name in ("fleet.md", "fleet.json"):
            if (reports / name).is_file():
                (LOGS / f"fleet-3x2-{name}").write_text((reports / name).read_text())
    return {"fleet_first_s": first, "fleet_rerun_s": rerun, "fleet_rerun_changed": run.changed()}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--calls", type=int, default=20, help="calls per layer and stat tasks per playbook")
    parser.add_argument("--skip-fleet", action="store_true", help="leave out the 3 nodes x 2 containers run")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--logs", type=Path, help="keep each playbook's output here")
    args = parser.parse_args()
    global LOGS
    LOGS = args.logs
    if LOGS:
        LOGS.mkdir(parents=True, exist_ok=True)

    tb = client.load()
    work = Path(tempfile.mkdtemp(prefix="mlstack-transport-"))
    runner = make_runner(work)
    cts = [container(v) for v in VMIDS]
    fig: dict[str, Any] = {}
    try:
        runner("destroy.yml", cts, mlstack_destroy_confirm=True)
        print("provisioning 1 node x 1 container, then 1 node x 2 containers (warm machine):", flush=True)
        fig["first_1ct_s"], _ = timed(runner, "provision.yml", cts[:1], "first provision, 1 container")
        runner("destroy.yml", cts[:1], mlstack_destroy_confirm=True)
        fig["first_2ct_s"], _ = timed(runner, "provision.yml", cts, "first provision (pct_ssh)")
        # Today's rerun (pct_ssh, the doctor's fast tier standing in on an unchanged stack), then the
        # doctor in full over each transport (the old rerun is pct_remote + full).
        reruns = {
            "pct_ssh_reuse": {"gpu_container_connection": TRANSPORTS["pct_ssh"]},
            "pct_ssh_full": {
                "gpu_container_connection": TRANSPORTS["pct_ssh"],
                "mlstack_doctor_reuse_passed": False,
            },
            "pct_remote_full": {
                "gpu_container_connection": TRANSPORTS["pct_remote"],
                "mlstack_doctor_reuse_passed": False,
            },
        }
        for name, extra in reruns.items():
            fig[f"rerun_{name}_s"], run = timed(runner, "provision.yml", cts, f"rerun ({name})", **extra)
            fig[f"rerun_{name}_changed"] = run.changed()
        print("per call and per task:", flush=True)
        fig.update(layer_costs(tb, VMIDS[0], args.calls, work))
        for name, transport in TRANSPORTS.items():
            fig[f"task_{name}_s"] = task_cost(tb, work, transport, VMIDS[0], args.calls)
        if not args.skip_fleet:
            fig.update(fleet(runner, work))
    finally:
        runner("destroy.yml", cts, mlstack_destroy_confirm=True)
        if not args.skip_fleet:
            runner("destroy.yml", fleet_containers(), mlstack_destroy_confirm=True)

    print("\nfigures (seconds):")
    for key, value in fig.items():
        print(f"  {key:<24} {value:8.3f}" if isinstance(value, float) else f"  {key:<24} {value}")
    print("\nratios (pct_remote / pct_ssh):")
    print(f"  per task inside a container   {fig['task_pct_remote_s'] / fig['task_pct_ssh_s']:6.2f}x")
    old = fig["rerun_pct_remote_full_s"]
    print(f"  changed=0 rerun, doctor full  {old / fig['rerun_pct_ssh_full_s']:6.2f}x")
    print(f"  changed=0 rerun, old / today  {old / fig['rerun_pct_ssh_reuse_s']:6.2f}x")
    print("goals:")
    print(f"  rerun per node <= 15 s        {fig['rerun_pct_ssh_reuse_s']:6.1f} s")
    print(f"  first container <= 120 s      {fig['first_1ct_s']:6.1f} s ({fig['first_2ct_s']:.1f} s for 2)")
    print(
        f"  pct exec share of a task      {fig['ssh_pct_exec_s'] / fig['task_pct_ssh_s']:6.0%}"
        f" (ssh alone {fig['ssh_kept_s']:.3f} s, lxc-attach alone {fig['lxc_attach_s']:.3f} s)"
    )
    if "fleet_first_s" in fig:
        print("one node against three (2 containers each, one run of provision.yml):")
        print(
            f"  first provision 3x2 / 1x2     {fig['fleet_first_s'] / fig['first_2ct_s']:6.2f}x (goal 1.5x)"
        )
        print(f"  changed=0 rerun 3x2 / 1x2     {fig['fleet_rerun_s'] / fig['rerun_pct_ssh_reuse_s']:6.2f}x")
        print(f"  rerun per node, 3 nodes       {fig['fleet_rerun_s'] / 3:6.1f} s")
    cores = os.cpu_count() or 1
    print(f"CPU of each run ({cores} cores here; no run takes less wall time than machine CPU / cores):")
    for label, c in CPU.items():
        print(
            f"  {label:<28} wall {c['wall_s']:7.1f} s  machine CPU {c['machine_cpu_s']:7.1f} s"
            f" (floor {c['machine_cpu_s'] / cores:6.1f} s)  controller CPU {c['controller_cpu_s']:6.1f} s"
        )
    fig["cpu"] = CPU
    if args.json:
        args.json.write_text(json.dumps(fig, indent=2) + "\n")


if __name__ == "__main__":
    main()
