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
from collections.abc import Callable
from pathlib import Path

from ab import Figure, alternate, children_cpu, save

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


def run(cfg: Path, *args: str) -> Figure:
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


def compare(
    title: str, sides: dict[str, Path], rounds: int, measure: Callable[[Path], Figure], json_out: Path | None
) -> dict[str, Figure]:
    """One workload, each side's config in turn: its rounds, medians and ratios printed (and saved)."""
    print(f"{title}:")
    results, med = alternate(list(sides), rounds, lambda side: measure(sides[side]))
    save(json_out, results, med)
    (d_cpu, d_wall), (o_cpu, o_wall) = med.values()
    print(f"ratio: CPU {d_cpu / o_cpu:.2f}x, wall {d_wall / o_wall:.2f}x")
    return med


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--wait", type=int, default=20, help="seconds the waiting task takes")
    ap.add_argument("--rerun", action="store_true", help="also a changed=0 rerun of CT 100 (testbed)")
    ap.add_argument("--first", action="store_true", help="also CT 100 destroyed and provisioned (testbed)")
    ap.add_argument("--json", type=Path, help="every round's figures and the medians, per side")
    args = ap.parse_args()

    def json_out(suffix: str) -> Path | None:
        return args.json.with_suffix(suffix) if args.json else None

    cfg = configparser.ConfigParser()
    cfg.read(CFG)
    ours = cfg.get("defaults", "internal_poll_interval", fallback=ANSIBLE_DEFAULT)
    # The copy sits beside ansible.cfg: Ansible resolves the config's relative paths from its folder.
    with (
        tempfile.NamedTemporaryFile("w", dir=REPO, prefix=".poll-bench-", suffix=".cfg") as default_cfg,
        tempfile.TemporaryDirectory(prefix="poll-bench.") as tmp,
    ):
        cfg.set("defaults", "internal_poll_interval", ANSIBLE_DEFAULT)
        cfg.write(default_cfg)
        default_cfg.flush()
        # Ansible's default first: the ratios are default / ours.
        sides = {f"{ANSIBLE_DEFAULT} (Ansible's)": Path(default_cfg.name), f"{ours} (ansible.cfg)": CFG}
        wait_play = Path(tmp) / "wait.yml"
        wait_play.write_text(WAIT_PLAY.format(seconds=args.wait))

        title = f"a task of {args.wait} s on localhost"
        med = compare(title, sides, args.rounds, lambda c: run(c, str(wait_play)), args.json)
        (d_cpu, _), (o_cpu, _) = med.values()
        print(f"{(d_cpu - o_cpu) / args.wait * 100:.1f}% of a core saved while the task waits")
        provision = "playbooks/provision.yml"
        if args.rerun:
            title = "changed=0 rerun of provision.yml (inventory/testbed, CT 100)"
            compare(title, sides, args.rounds, lambda c: run(c, provision), json_out(".rerun.json"))
        if args.first:
            destroy = ("playbooks/destroy.yml", "-e", "mlstack_destroy_confirm=true")

            def first(c: Path) -> Figure:
                run(CFG, *destroy)
                return run(c, provision)

            compare(
                "first provision of CT 100 (destroyed before each)",
                sides,
                args.rounds,
                first,
                json_out(".first.json"),
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
