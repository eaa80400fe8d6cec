#!/usr/bin/env python3
"""Provisioning benchmark on the testbed: every figure measured in one run, ratios printed.

  .venv/bin/python bench/provision_bench.py [--skip-n4] [--json out.json]

Uses its own cold uv cache on the node (so the first container really downloads) and vmids
190-197, destroyed at the end. Figures: first vs second container provision and their venv build
times (shared uv cache), idempotent rerun, verify.yml, upgrade.yml to triton 3.7, and provisioning
N = 1, 2, 4 containers in one run. Per-task times come from the profile_tasks callback.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "provision"))

from playbook_runner import PlaybookRun, callbacks_with, container, make_runner  # noqa: E402

BENCH_CACHE = "/var/lib/mlstack/bench/cache/uv"
VENV_TASK = "Build the venv from the lock"


def profile_env(repo: Path = REPO) -> dict[str, str]:
    """profile_tasks' per-task times, beside the callbacks `repo`'s ansible.cfg enables."""
    return {
        "ANSIBLE_CALLBACKS_ENABLED": callbacks_with("ansible.posix.profile_tasks", repo=repo),
        "PROFILE_TASKS_TASK_OUTPUT_LIMIT": "all",
    }


CACHE_VARS = {"pve_host_uv_cache_dir": BENCH_CACHE, "gpu_container_uv_cache_dir": BENCH_CACHE}


def task_times(output: str) -> list[tuple[str, float]]:
    """(task, wall seconds) of each line of profile_tasks' summary ("role : task ---- 1.23s")."""
    times = []
    for line in output.splitlines():
        m = re.match(r"^(.*?) -{2,} (\d+(?:\.\d+)?)s$", line.strip())
        if m:
            times.append((m.group(1), float(m.group(2))))
    return times


def task_seconds(run: PlaybookRun, name: str) -> float:
    """Wall seconds of the tasks whose name starts with `name`, from profile_tasks' summary."""
    return sum(seconds for task, seconds in task_times(run.output) if name in task)


def build_seconds(run: PlaybookRun) -> float | None:
    """The venv builder's own time ("mlstack-build-venv: built ... in X s"), free of Ansible's polling."""
    # The YAML callback folds long messages: any whitespace, newlines included, between the words.
    times = [float(m) for m in re.findall(r"mlstack-build-venv: built\s+\S+\s+in\s+([0-9.]+) s", run.output)]
    return sum(times) if times else None


LOGS: Path | None = None


def timed(runner: Any, playbook: str, cts: list[dict[str, Any]], **extra: Any) -> tuple[float, PlaybookRun]:
    t0 = time.monotonic()
    run = runner(playbook, cts, timeout=3600, **CACHE_VARS, **extra)
    elapsed = time.monotonic() - t0
    if LOGS:
        name = f"{int(t0)}-{playbook.removesuffix('.yml')}-{len(cts)}ct.log"
        (LOGS / name).write_text(run.output)
    if run.rc != 0:
        sys.exit(f"{playbook} failed (rc {run.rc}):\n{run.output[-4000:]}")
    print(f"  {playbook:<14} {len(cts)} CT(s): {elapsed:7.1f} s  changed={run.changed()}", flush=True)
    return elapsed, run


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--skip-n4", action="store_true", help="measure N = 1, 2 only")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--logs", type=Path, help="keep each playbook's output (with task times) here")
    args = parser.parse_args()
    global LOGS
    LOGS = args.logs
    if LOGS:
        LOGS.mkdir(parents=True, exist_ok=True)

    shutil.rmtree(BENCH_CACHE, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix="mlstack-bench-"))
    runner = make_runner(work, env=profile_env())
    first, second = [container(190)], [container(191)]
    all_vmids = list(range(190, 198))
    fig: dict[str, Any] = {}
    try:
        print("provisioning (cold uv cache, then shared):", flush=True)
        fig["first_provision_s"], r1 = timed(runner, "provision.yml", first)
        fig["first_venv_task_s"] = task_seconds(r1, VENV_TASK)
        fig["first_venv_build_s"] = build_seconds(r1)
        fig["second_provision_s"], r2 = timed(runner, "provision.yml", second)
        fig["second_venv_task_s"] = task_seconds(r2, VENV_TASK)
        fig["second_venv_build_s"] = build_seconds(r2)
        fig["rerun_s"], r3 = timed(runner, "provision.yml", first + second)
        fig["rerun_changed"] = r3.changed()
        fig["verify_s"], _ = timed(runner, "verify.yml", first + second)
        fig["upgrade_s"], r4 = timed(
            runner, "upgrade.yml", first, mlstack_upgrade_profile="torch211-triton37"
        )
        fig["upgrade_venv_task_s"] = task_seconds(r4, VENV_TASK)
        fig["upgrade_venv_build_s"] = build_seconds(r4)
        print("N containers in one run (shared uv cache):", flush=True)
        sizes = [1, 2] if args.skip_n4 else [1, 2, 4]
        next_vmid = 192
        for n in sizes:
            cts = [container(v) for v in range(next_vmid, next_vmid + n)]
            next_vmid += n
            fig[f"n{n}_provision_s"], _ = timed(runner, "provision.yml", cts)
            runner("destroy.yml", cts, mlstack_destroy_confirm=True)
    finally:
        runner("destroy.yml", [container(v) for v in all_vmids], mlstack_destroy_confirm=True)

    print("\nfigures (build_s: the builder's own time; task_s: the Ansible task, polling included):")
    for key, value in fig.items():
        print(f"  {key:<22} {value:8.1f}" if isinstance(value, float) else f"  {key:<22} {value}")
    if fig.get("first_venv_build_s") and fig.get("second_venv_build_s"):
        venv_ratio = fig["first_venv_build_s"] / max(fig["second_venv_build_s"], 0.1)
        print(f"  venv build first / second {venv_ratio:6.1f}x  (goal >= 5x)")
    task_ratio = fig["first_venv_task_s"] / max(fig["second_venv_task_s"], 0.01)
    print(f"  venv task first / second  {task_ratio:6.1f}x")
    print(f"  provision first / second {fig['first_provision_s'] / fig['second_provision_s']:5.1f}x")
    for n in sizes[1:]:
        print(f"  N={n} vs N=1 time      {fig[f'n{n}_provision_s'] / fig['n1_provision_s']:8.2f}x")
    if args.json:
        args.json.write_text(json.dumps(fig, indent=2) + "\n")


if __name__ == "__main__":
    main()
