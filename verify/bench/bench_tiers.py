#!/usr/bin/env python3
"""Time the doctor's tiers beside each other: each tier N times, each run a fresh `python -m mlstack_doctor`
process (as monitoring and provisioning run it), rounds interleaved so both tiers see the same machine.

Prints the median wall per tier and the ratio of each tier to the first one (quick/fast by default),
all measured in this one run. A tier written TIER+cold runs with the cache's model config stamps removed
first (config_stamp), so `--tiers quick+cold,quick` compares a build of the config with a stamped one.
Standard library only.

  python3 verify/bench/bench_tiers.py --no-gpu -n 5            # a CPU machine
  python3 verify/bench/bench_tiers.py -n 3 --json tiers.json   # a GPU machine
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))
from mlstack_doctor.cache.config_stamp import STAMP_DIR  # noqa: E402


def once(tier: str, extra: list[str], cache: str) -> tuple[float, int, str | None]:
    if tier.endswith("+cold"):
        tier = tier.removesuffix("+cold")
        shutil.rmtree(Path(cache) / STAMP_DIR, ignore_errors=True)
    env = dict(
        os.environ, TRITON_CACHE_DIR=cache, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    )
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mlstack_doctor", "--tier", tier, "--quiet", "--json", *extra],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    try:
        root = (json.loads(proc.stdout)["summary"].get("root_cause") or {}).get("code")
    except (ValueError, KeyError):
        root = f"no report (rc {proc.returncode}): {proc.stderr.strip()[-200:]}"
    return wall, proc.returncode, root


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiers", default="fast,quick", help="comma-separated tiers, the first is the base")
    p.add_argument("-n", type=int, default=5, help="runs per tier (default 5)")
    p.add_argument("--no-gpu", action="store_true", help="pass --no-gpu to the doctor (a CPU machine)")
    p.add_argument("--json", metavar="FILE", help="write the figures as JSON")
    args, doctor_args = p.parse_known_args(argv)
    tiers = [t.strip() for t in args.tiers.split(",") if t.strip()]
    extra = (["--no-gpu"] if args.no_gpu else []) + doctor_args
    walls: dict[str, list[float]] = {t: [] for t in tiers}
    roots: dict[str, set[str | None]] = {t: set() for t in tiers}
    with tempfile.TemporaryDirectory(prefix="bench-tiers-") as cache:  # one warm-able cache for all runs
        for i in range(args.n):
            for tier in tiers:
                wall, rc, root = once(tier, extra, cache)
                walls[tier].append(wall)
                roots[tier].add(root)
                print(f"  run {i + 1} {tier}: {wall:.2f} s rc={rc} root_cause={root}", flush=True)
    base = statistics.median(walls[tiers[0]])
    rows = []
    print(f"\n{'tier':<10} {'median_s':>9} {'min_s':>7} {'max_s':>7} {'x ' + tiers[0]:>9}  root causes")
    for tier in tiers:
        med = statistics.median(walls[tier])
        ratio = med / base if base else float("nan")
        rows.append({"tier": tier, "median_s": med, "walls_s": walls[tier], "ratio": ratio})
        causes = ",".join(sorted(str(r) for r in roots[tier]))
        print(f"{tier:<10} {med:9.2f} {min(walls[tier]):7.2f} {max(walls[tier]):7.2f} {ratio:9.1f}  {causes}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"runs": args.n, "doctor_args": extra, "tiers": rows}, indent=2)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
