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

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "testbed"))

from ab import alternate, arguments, children_cpu, save  # noqa: E402
from mlstack_testbed import paths  # noqa: E402
from mlstack_testbed.lxc import realct  # noqa: E402
from mlstack_testbed.node import disk  # noqa: E402


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
    args = arguments(__doc__, rounds=5)
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
    try:
        results, med = alternate(list(sides), args.rounds, lambda side: round_on(tarball, sides[side]))
    finally:
        for work in sides.values():
            shutil.rmtree(work, ignore_errors=True)
    root_cpu, disk_cpu = med["root filesystem"][0], med["testbed's disk"][0]
    print(f"ratio root filesystem / testbed's disk (CPU): {root_cpu / disk_cpu:.1f}x")
    save(args.json, results, med)
    return 0


if __name__ == "__main__":
    sys.exit(main())
