#!/usr/bin/env python3
"""The testbed's disk against the machine's root filesystem, in one run: the container template unpacked
the way `pct create` does (tar through lxc-usernsexec, ids shifted), right after an unpacked copy was
removed, as happens all day while tests make and destroy containers.

  .venv/bin/python bench/disk_bench.py [--rounds N] [--json out.json]

Needs root, the testbed up (its template built) and its disk mounted (`testbed status` lists each folder
on the testbed's disk; there is none where the root filesystem has a journal). Each round, on each side in
turn (the order alternates): unpack a copy, remove it, unpack again, and time that last unpack (CPU of
the unpack's processes, user and kernel, and its wall time). Prints each side's median and their ratio;
works in <folder>/disk-bench.<pid> on each side and removes it.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "testbed"))

from mlstack_testbed import paths  # noqa: E402
from mlstack_testbed.lxc import realct  # noqa: E402
from mlstack_testbed.node import disk  # noqa: E402


def children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def unpack(tarball: Path, root: Path) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one unprivileged unpack into root."""
    root.mkdir(parents=True)
    os.chown(root, realct.IDMAP.host_base, realct.IDMAP.host_base)
    cpu0, t0 = children_cpu(), time.monotonic()
    subprocess.run(realct.unpack_argv(tarball, root, unprivileged=True), check=True)
    return children_cpu() - cpu0, time.monotonic() - t0


def round_on(tarball: Path, work: Path) -> tuple[float, float]:
    unpack(tarball, work / "removed")
    shutil.rmtree(work / "removed")
    cpu, wall = unpack(tarball, work / "kept")
    shutil.rmtree(work / "kept")
    return cpu, wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    tarball = paths.TEMPLATE_CACHE / paths.TEMPLATE_NAME
    the_disk = disk.testbed_disk()
    held = [f for f, where in the_disk.state()["folders"].items() if where == "on the testbed's disk"]
    if os.geteuid() != 0 or not tarball.is_file() or not held:
        print("needs root, the testbed's template and its disk mounted (`testbed up`, `testbed status`)")
        return 2
    sides = {
        "root filesystem": Path("/var/tmp") / f"disk-bench.{os.getpid()}",
        "testbed's disk": Path(held[0]) / f"disk-bench.{os.getpid()}",
    }
    results: dict[str, list[tuple[float, float]]] = {s: [] for s in sides}
    try:
        for i in range(args.rounds):
            order = list(sides) if i % 2 == 0 else list(reversed(sides))
            for side in order:
                cpu, wall = round_on(tarball, sides[side])
                results[side].append((cpu, wall))
                print(f"round {i + 1} {side:16s} unpack {cpu:5.2f} CPU-s, {wall:5.2f} s", flush=True)
    finally:
        for work in sides.values():
            shutil.rmtree(work, ignore_errors=True)
    med = {
        side: (statistics.median(c for c, _ in r), statistics.median(w for _, w in r))
        for side, r in results.items()
    }
    root_cpu, disk_cpu = med["root filesystem"][0], med["testbed's disk"][0]
    for side, (cpu, wall) in med.items():
        print(f"median {side:16s} {cpu:5.2f} CPU-s, {wall:5.2f} s")
    print(f"ratio root filesystem / testbed's disk (CPU): {root_cpu / disk_cpu:.1f}x")
    if args.json:
        args.json.write_text(json.dumps({"rounds": results, "median": med}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
