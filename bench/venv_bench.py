#!/usr/bin/env python3
"""The controller venv (`make venv`'s pins) built by tools/venv-install (uv) and by pip, in one run.

  .venv/bin/python bench/venv_bench.py [--rounds N] [--json out.json]

Each round builds a fresh venv each way in turn (the order alternates), from the same requirements and
lock, with the package caches warm after the first round (uv's and pip's own). Times the install (wall, and
the CPU of its processes, user and kernel), checks that both venvs hold exactly the lock's packages, and
prints each side's median and their ratio. Works in a temporary folder and removes it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ab import alternate, arguments, children_cpu, save

REPO = Path(__file__).resolve().parents[1]
REQUIREMENTS = REPO / "requirements-controller.txt"
LOCK = REPO / "requirements-controller.lock"
VERIFY = REPO / "verify"


def pip_install(venv: Path) -> None:
    """What `make venv` ran before tools/venv-install."""
    pip = [str(venv / "bin" / "pip"), "--disable-pip-version-check", "install", "-q"]
    subprocess.run([*pip, "-r", str(REQUIREMENTS), "-c", str(LOCK)], check=True)
    subprocess.run([*pip, "-e", str(VERIFY)], check=True)


def uv_install(venv: Path) -> None:
    subprocess.run(
        [str(REPO / "tools" / "venv-install"), str(venv), str(REQUIREMENTS), str(LOCK), "-e", str(VERIFY)],
        check=True,
    )


SIDES = {"pip": pip_install, "tools/venv-install": uv_install}


def build(side: str, venv: Path) -> tuple[float, float]:
    """(CPU seconds, wall seconds) of one install into a new venv; the venv must match the lock."""
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    cpu0, t0 = children_cpu(), time.monotonic()
    SIDES[side](venv)
    cpu, wall = children_cpu() - cpu0, time.monotonic() - t0
    freeze = subprocess.run(
        [str(venv / "bin" / "pip"), "--disable-pip-version-check", "freeze", "--exclude-editable"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    if sorted(freeze.split()) != sorted(LOCK.read_text().split()):
        raise SystemExit(f"{side}: the venv's packages differ from {LOCK.name}")
    shutil.rmtree(venv)
    return cpu, wall


def main() -> int:
    args = arguments(__doc__, rounds=3)
    with tempfile.TemporaryDirectory(prefix="venv-bench.") as tmp:
        results, med = alternate(list(SIDES), args.rounds, lambda side: build(side, Path(tmp) / "venv"))
    (pip_cpu, pip_wall), (uv_cpu, uv_wall) = med["pip"], med["tools/venv-install"]
    print(f"ratio pip / tools/venv-install: wall {pip_wall / uv_wall:.1f}x, CPU {pip_cpu / uv_cpu:.1f}x")
    save(args.json, results, med)
    return 0


if __name__ == "__main__":
    sys.exit(main())
