#!/usr/bin/env python3
"""ansible-playbook's CPU with Ansible's internal_poll_interval (0.001 s) and with the checkout's ansible.cfg.

  .venv/bin/python bench/poll_bench.py [--rounds N] [--wait S] [--rerun] [--first] [--json out.json]

While a task runs, ansible-playbook's main process checks its workers every internal_poll_interval seconds.
Each round runs, with each setting in turn (the order alternating): a play on localhost whose one task
waits S seconds (`command: sleep S`, default 20), the CPU of that run being mostly the checks; and with
--rerun a changed=0 rerun of provision.yml against the checkout's inventory (CT 100 of the testbed,
provisioned first by `make provision`), whose wall time shows what the longer interval costs in latency;
and with --first CT 100 destroyed (destroy.yml) and provisioned again: a first container, whose apt, venv
and doctor tasks take most of a minute.
Both sides use the checkout's ansible.cfg; the default side's copy differs only in that one setting.
Prints each side's medians and their ratios.
"""

from __future__ import annotations

import argparse
import configparser
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ab import alternate, children_cpu, save

REPO = Path(__file__).resolve().parents[1]
CFG = REPO / "ansible.cfg"
PLAYBOOK = REPO / ".venv" / "bin" / "ansible-playbook"
ANSIBLE_DEFAULT = "0.001"  # ansible-core's own default (config/base.yml, DEFAULT_INTERNAL_POLL_INTERVAL)
WAIT_PLAY = """- name: One task that waits
  hosts: localhost
  gather_facts: false
  tasks:
    - name: Wait
      ansible.builtin.command: sleep {seconds}
      changed_when: false
"""


def checkout_interval() -> str:
    cfg = configparser.ConfigParser()
    cfg.read(CFG)
    return cfg.get("defaults", "internal_poll_interval", fallback=ANSIBLE_DEFAULT)


def run(cfg: Path, *args: str) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one ansible-playbook run, which must pass."""
    cpu0, t0 = children_cpu(), time.monotonic()
    subprocess.run(
        [str(PLAYBOOK), *args],
        cwd=REPO,
        env={"ANSIBLE_CONFIG": str(cfg), "PATH": f"{REPO / '.venv' / 'bin'}:/usr/sbin:/usr/bin:/sbin:/bin"},
        stdout=subprocess.DEVNULL,
        check=True,
    )
    return children_cpu() - cpu0, time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wait", type=int, default=20, help="seconds the waiting task takes")
    ap.add_argument("--rerun", action="store_true", help="also a changed=0 rerun of CT 100 (testbed)")
    ap.add_argument("--first", action="store_true", help="also CT 100 destroyed and provisioned (testbed)")
    ap.add_argument("--json", type=Path, help="every round's figures and the medians, per side")
    args = ap.parse_args()

    ours = checkout_interval()
    sides = {f"{ANSIBLE_DEFAULT} (Ansible's)": ANSIBLE_DEFAULT, f"{ours} (ansible.cfg)": ours}
    # The copy sits beside ansible.cfg: Ansible resolves the config's relative paths from its folder.
    with (
        tempfile.NamedTemporaryFile("w", dir=REPO, prefix=".poll-bench-", suffix=".cfg") as default_cfg,
        tempfile.TemporaryDirectory(prefix="poll-bench.") as tmp,
    ):
        cfg = configparser.ConfigParser()
        cfg.read(CFG)
        cfg.set("defaults", "internal_poll_interval", ANSIBLE_DEFAULT)
        cfg.write(default_cfg)
        default_cfg.flush()
        configs = {ANSIBLE_DEFAULT: Path(default_cfg.name), ours: CFG}
        wait_play = Path(tmp) / "wait.yml"
        wait_play.write_text(WAIT_PLAY.format(seconds=args.wait))

        print(f"a task of {args.wait} s on localhost:")
        results, med = alternate(list(sides), args.rounds, lambda s: run(configs[sides[s]], str(wait_play)))
        save(args.json, results, med)
        (d_cpu, _), (o_cpu, _) = (med[s] for s in sides)
        print(f"ratio: CPU {d_cpu / o_cpu:.2f}x ({(d_cpu - o_cpu) / args.wait * 100:.1f}% of a core saved)")
        if args.rerun:
            print("changed=0 rerun of provision.yml (inventory/testbed, CT 100):")
            play = "playbooks/provision.yml"
            results, med = alternate(list(sides), args.rounds, lambda s: run(configs[sides[s]], play))
            (d_cpu, d_wall), (o_cpu, o_wall) = (med[s] for s in sides)
            print(f"ratio: CPU {d_cpu / o_cpu:.2f}x, wall {d_wall / o_wall:.2f}x")
            if args.json:
                save(args.json.with_suffix(".rerun.json"), results, med)
        if args.first:
            print("first provision of CT 100 (destroyed before each):")
            destroy = ("playbooks/destroy.yml", "-e", "mlstack_destroy_confirm=true")

            def first(side: str) -> tuple[float, float]:
                run(CFG, *destroy)
                return run(configs[sides[side]], "playbooks/provision.yml")

            results, med = alternate(list(sides), args.rounds, first)
            (d_cpu, d_wall), (o_cpu, o_wall) = (med[s] for s in sides)
            print(f"ratio: CPU {d_cpu / o_cpu:.2f}x, wall {d_wall / o_wall:.2f}x")
            if args.json:
                save(args.json.with_suffix(".first.json"), results, med)
    return 0


if __name__ == "__main__":
    sys.exit(main())
