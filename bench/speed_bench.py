#!/usr/bin/env python3
"""Before and after, in one run on one machine: the same playbook runs from another commit's checkout
(--baseline, a git worktree) and from this one, back to back, with the ratios.

  .venv/bin/python bench/speed_bench.py --baseline REV [--skip-fleet] [--rerun-repeats N] [--json out.json]
      [--logs DIR]

Needs the testbed up with 3 nodes (`make testbed`) and a warm machine (run it after `make provision`:
the node's uv store holds the stack). Uses vmids 190-197, destroyed at the end. Figures, each as
baseline / this checkout:
- first container (1 node x 1, CT 190): provision.yml from scratch;
- second container of a node (CT 191, CT 190 running with a venv of the same lock): provision.yml from
  scratch;
- changed=0 rerun of 1 node x 2 containers (CT 190-191): wall seconds, TASK headers printed, changed;
  each side's rerun follows one rerun of its own (the other side's run may differ in what it writes);
  with --rerun-repeats N the sides take turns N times and each side's figure is its median run (all
  its walls listed), as one rerun is about 10 s and one run's noise here is about 1 s;
- 3 nodes x 2 containers first provision (CT 192-197), unless --skip-fleet.
For every run: wall seconds and the CPU it cost the whole machine (/proc/stat) and the controller; for the
first container, where its time goes: the task times (profile_tasks) summed per role, for both sides.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "provision"))
sys.path.insert(0, str(REPO / "testbed"))

from fleet_bench import controller_seconds, machine_busy_seconds  # noqa: E402
from playbook_runner import PlaybookRun, container, make_runner  # noqa: E402
from provision_bench import profile_env, task_times  # noqa: E402

PAIR = (190, 191)
FLEET = {"testbed": (192, 193), "testbed2": (194, 195), "testbed3": (196, 197)}
LOGS: Path | None = None


def worktree(rev: str) -> Path:
    """A checkout of `rev` beside this one, resolvable as the collection mlstack.pve (as `make venv` links
    this checkout): its own roles, plugins and playbooks run, with this checkout's .venv tools."""
    sha = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--verify", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    path = REPO / "build" / f"bench-baseline-{sha[:12]}"
    if not path.exists():
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), sha], check=True)
    link = path / ".venv" / "collections" / "ansible_collections" / "mlstack" / "pve"
    link.parent.mkdir(parents=True, exist_ok=True)
    if not link.is_symlink():
        link.symlink_to(path)
    return path


def per_role(output: str) -> dict[str, float]:
    """Seconds per role (tasks outside a role: "play"), from profile_tasks' per-task lines."""
    roles: dict[str, float] = {}
    for task, seconds in task_times(output):
        role = task.split(" : ", 1)[0] if " : " in task else "play"
        roles[role] = roles.get(role, 0.0) + seconds
    return {r: round(t, 1) for r, t in sorted(roles.items(), key=lambda kv: -kv[1])}


def timed(runner: Any, playbook: str, cts: Any, label: str) -> dict[str, Any]:
    busy0, ctl0, t0 = machine_busy_seconds(), controller_seconds(), time.monotonic()
    run: PlaybookRun = runner(playbook, cts, timeout=3600)
    fig = {
        "wall_s": round(time.monotonic() - t0, 1),
        "machine_cpu_s": round(machine_busy_seconds() - busy0, 1),
        "controller_cpu_s": round(controller_seconds() - ctl0, 1),
        "tasks": run.output.count("\nTASK ["),
        "changed": run.changed(),
        "per_role_s": per_role(run.output),
    }
    if LOGS:
        (LOGS / f"{label.replace(' ', '_').replace('/', '_')}.log").write_text(run.output)
    if run.rc != 0:
        sys.exit(f"{label} failed (rc {run.rc}):\n{run.output[-4000:]}")
    print(f"  {label:<34} { {k: v for k, v in fig.items() if k != 'per_role_s'} }", flush=True)
    return fig


def both(sides: dict[str, Any], label: str, measure: Any, repeats: int = 1) -> dict[str, dict[str, Any]]:
    """Each side's figure; with repeats > 1 the sides take turns and each keeps its median run by wall."""
    runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    for turn in range(repeats):
        for side, runner in sides.items():
            runs[side].append(measure(runner, f"{label} ({side})" + (f" #{turn + 1}" if repeats > 1 else "")))
    out = {}
    for side, figs in runs.items():
        median = sorted(figs, key=lambda f: f["wall_s"])[len(figs) // 2]
        out[side] = {**median, "walls_s": [f["wall_s"] for f in figs]} if repeats > 1 else median
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--baseline", required=True, help="the commit to compare with (a tag, branch or sha)")
    parser.add_argument("--skip-fleet", action="store_true", help="leave out the 3 nodes x 2 containers runs")
    parser.add_argument("--rerun-repeats", type=int, default=1, help="turns of the rerun (median kept)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--logs", type=Path, help="keep each playbook's output here")
    args = parser.parse_args()
    global LOGS
    LOGS = args.logs
    if LOGS:
        LOGS.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="mlstack-speed-"))
    base = worktree(args.baseline)
    sides = {
        "baseline": make_runner(work / "baseline", repo=base, env=profile_env(base)),
        "this": make_runner(work / "this", env=profile_env()),
    }
    for folder in ("baseline", "this"):
        (work / folder).mkdir()
    this = sides["this"]
    pair = [container(v) for v in PAIR]
    fleet = {node: [container(v) for v in vmids] for node, vmids in FLEET.items()}
    fig: dict[str, Any] = {"baseline": args.baseline}

    def first(runner: Any, label: str) -> dict[str, Any]:
        this("destroy.yml", pair[:1], mlstack_destroy_confirm=True)
        return timed(runner, "provision.yml", pair[:1], label)

    def second(runner: Any, label: str) -> dict[str, Any]:
        this("destroy.yml", pair[1:], mlstack_destroy_confirm=True)
        return timed(runner, "provision.yml", pair[1:], label)

    def rerun(runner: Any, label: str) -> dict[str, Any]:
        timed(runner, "provision.yml", pair, f"{label} to settle")
        return timed(runner, "provision.yml", pair, label)

    def fleet_first(runner: Any, label: str) -> dict[str, Any]:
        this("destroy.yml", fleet, mlstack_destroy_confirm=True)
        return timed(runner, "provision.yml", fleet, label)

    try:
        print("first container, 1 node x 1:", flush=True)
        fig["first_container"] = both(sides, "first container", first)
        print("second container of the node, 1 node x 1:", flush=True)
        fig["second_container"] = both(sides, "second container", second)
        this("provision.yml", pair)
        print("changed=0 rerun, 1 node x 2:", flush=True)
        fig["rerun_1x2"] = both(sides, "rerun 1x2", rerun, args.rerun_repeats)
        if not args.skip_fleet:
            this("destroy.yml", pair, mlstack_destroy_confirm=True)
            print("first provision, 3 nodes x 2:", flush=True)
            fig["first_3x2"] = both(sides, "first 3x2", fleet_first)
    finally:
        this("destroy.yml", pair, mlstack_destroy_confirm=True)
        if not args.skip_fleet:
            this("destroy.yml", fleet, mlstack_destroy_confirm=True)

    print(f"\nbaseline {args.baseline} / this checkout:")
    for name in ("first_container", "second_container", "rerun_1x2", "first_3x2"):
        if name in fig:
            b, t = fig[name]["baseline"], fig[name]["this"]
            ratio = b["wall_s"] / t["wall_s"]
            print(
                f"  {name:<16} wall {b['wall_s']:7.1f} / {t['wall_s']:7.1f} s = {ratio:5.2f}x"
                f"  machine CPU {b['machine_cpu_s']:7.1f} / {t['machine_cpu_s']:7.1f} s"
                f"  tasks {b['tasks']} / {t['tasks']}  changed {b['changed']} / {t['changed']}"
            )
    for name in ("first_container", "second_container"):
        if name in fig:
            b, t = (fig[name][side]["per_role_s"] for side in ("baseline", "this"))
            print(f"\n{name}, seconds per role (task times), baseline / this checkout:")
            for role in sorted({*b, *t}, key=lambda r: -max(b.get(r, 0.0), t.get(r, 0.0))):
                print(f"  {role:<16} {b.get(role, 0.0):7.1f} / {t.get(role, 0.0):7.1f}")
    if args.json:
        args.json.write_text(json.dumps(fig, indent=2) + "\n")


if __name__ == "__main__":
    main()
