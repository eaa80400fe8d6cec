#!/usr/bin/env python3
"""The preflight's read of the cluster's guests: community.proxmox's proxmox_vm_info twice (config=current,
then config=pending, as the role read them before) against mlstack.pve.pve_guests once, on a cluster that
also runs guests this project does not own.

  .venv/bin/python bench/guests_bench.py [--foreign N] [--rounds R] [--json out.json]

Needs the testbed (`make testbed`) and CT 100 of inventory/testbed running (`make provision`): the
project's one container. Creates N containers without the project's tag (vmids 800 on, stopped, as a
team's other guests), measures each side R times in turn (ansible-playbook on localhost, one play with
the side's tasks: wall seconds, and the CPU of ansible-playbook and its module runs), prints the medians
and their ratio, and removes the N containers.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ab import Figure, alternate, children_cpu, save

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "testbed"))
sys.path.insert(0, str(REPO / "tests" / "testbed"))

from mlstack_testbed import client  # noqa: E402
from proxmoxer.core import ResourceException  # noqa: E402
from tbhelpers import LOCAL_INVENTORY, api_args, remove_ct, wait_ok  # noqa: E402

FIRST_VMID = 800
OURS = 100


def plays(testbed: client.Testbed, side: str) -> str:
    auth = api_args(testbed)
    if side == "proxmox_vm_info x2":
        tasks = [
            {"community.proxmox.proxmox_vm_info": {**auth, "config": config}, "no_log": True}
            for config in ("current", "pending")
        ]
    else:
        tasks = [
            {
                "mlstack.pve.pve_guests": {**auth, "tag": "mlstack", "vmids": [OURS], "pending": True},
                "no_log": True,
            }
        ]
    return json.dumps([{"hosts": "localhost", "gather_facts": False, "tasks": tasks}])


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--foreign", type=int, default=24, help="containers without the project's tag")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    testbed = client.load()
    api = testbed.proxmox()
    lxc = api.nodes(testbed.node).lxc
    try:
        running = lxc(OURS).status.current.get()["status"] == "running"
    except ResourceException:
        running = False
    if not running:
        sys.exit(f"CT {OURS} of inventory/testbed must run: make provision")
    work = Path(tempfile.mkdtemp(prefix="mlstack-guests-bench-"))
    (work / "hosts.json").write_text(LOCAL_INVENTORY)
    env_cfg = work / "ansible.cfg"
    env_cfg.write_text(
        f"[defaults]\ncollections_path = {REPO / '.venv' / 'collections'}\nretry_files_enabled = False\n"
    )
    sides = ("proxmox_vm_info x2", "pve_guests")
    for side in sides:
        (work / f"{side.split()[0]}.json").write_text(plays(testbed, side))
    vmids = range(FIRST_VMID, FIRST_VMID + args.foreign)
    t0 = time.monotonic()
    for vmid in vmids:
        remove_ct(api, testbed, vmid)
        wait_ok(
            api,
            testbed,
            lxc.post(vmid=vmid, ostemplate=testbed.template, storage=testbed.storage, unprivileged=1),
        )
    print(f"{args.foreign} foreign containers created in {time.monotonic() - t0:.0f} s", flush=True)

    def measure(side: str) -> Figure:
        cpu0, wall0 = children_cpu(), time.monotonic()
        r = subprocess.run(
            [
                str(REPO / ".venv" / "bin" / "ansible-playbook"),
                "-i",
                str(work / "hosts.json"),
                str(work / f"{side.split()[0]}.json"),
            ],
            capture_output=True,
            text=True,
            env={
                "PATH": "/usr/bin:/bin",
                "HOME": str(work),
                "ANSIBLE_CONFIG": str(env_cfg),
                "REQUESTS_CA_BUNDLE": testbed.api_ca_file,
            },
            check=False,
        )
        figure = (children_cpu() - cpu0, time.monotonic() - wall0)
        if r.returncode != 0:
            sys.exit(f"{side} failed:\n{r.stdout[-3000:]}{r.stderr[-2000:]}")
        return figure

    try:
        results, med = alternate(sides, args.rounds, measure)
    finally:
        for vmid in vmids:
            remove_ct(api, testbed, vmid)
    before, after = med[sides[0]], med[sides[1]]
    (cpu_b, wall_b), (cpu_a, wall_a) = before, after
    print(
        f"with {args.foreign} foreign guests: wall {wall_b:.2f} / {wall_a:.2f} s = {wall_b / wall_a:.2f}x,"
        f" CPU {cpu_b:.2f} / {cpu_a:.2f} s = {cpu_b / cpu_a:.2f}x"
    )
    save(args.json, results, med)


if __name__ == "__main__":
    main()
