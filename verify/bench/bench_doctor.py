#!/usr/bin/env python3
"""Time the doctor: quick tier; full tier on a cold vs a warm Triton cache; a big model's tok/s and MFU.

Each measurement is a fresh `python -m mlstack_doctor` process (imports and all), as provisioning
runs it. Standard library only. Prints a table; --output writes the figures as JSON.

  python3 verify/bench/bench_doctor.py --model tiny --big-model 27b --tokens 2048 --output bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"


def doctor(args: list[str], cache: str, log_dir: Path, tag: str) -> dict[str, Any]:
    env = dict(
        os.environ, TRITON_CACHE_DIR=cache, PYTHONPATH=f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"
    )
    out = log_dir / f"{tag}.json"
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "mlstack_doctor", "--quiet", "--output", str(out), *args],
        env=env,
        capture_output=True,
        text=True,
    )
    wall = time.perf_counter() - t0
    (log_dir / f"{tag}.txt").write_text(proc.stdout + proc.stderr)
    report = json.loads(out.read_text()) if out.is_file() else {}
    probes = {p["name"]: p for p in report.get("probes", [])}
    entries = len(os.listdir(cache)) if os.path.isdir(cache) else 0
    return {
        "tag": tag,
        "rc": proc.returncode,
        "wall_s": round(wall, 1),
        "probes": probes,
        "root_cause": (report.get("summary") or {}).get("root_cause"),
        "cache_entries": entries,
    }


def fwd(run: dict[str, Any]) -> dict[str, Any]:
    return (run["probes"].get("model_forward") or {}).get("evidence", {})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny", help="model for the cold/warm full-tier runs")
    ap.add_argument("--big-model", default="27b", help="model for tok/s and MFU ('' to skip)")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--big-warm", action="store_true", help="also rerun the big model on the warm cache")
    ap.add_argument("--output", default=None)
    ap.add_argument("--logs", default=None, help="folder for each run's report and table")
    a = ap.parse_args()
    log_dir = Path(a.logs or tempfile.mkdtemp(prefix="mlstack-bench-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    cache = tempfile.mkdtemp(prefix="mlstack-bench-cache-")
    runs: dict[str, dict[str, Any]] = {}
    try:
        if a.model:
            common = ["--model", a.model, "--tokens", str(a.tokens)]
            runs["full_cold"] = doctor(["--tier", "full", *common], cache, log_dir, "full_cold")
            runs["full_warm"] = doctor(["--tier", "full", "--no-peak", *common], cache, log_dir, "full_warm")
            runs["quick_warm"] = doctor(["--tier", "quick", "--model", a.model], cache, log_dir, "quick_warm")
        if a.big_model:
            # Same cache: autotune keys depend on layer widths; the big model warms its own shapes.
            runs["big_cold"] = doctor(
                ["--tier", "full", "--model", a.big_model, "--tokens", str(a.tokens)],
                cache,
                log_dir,
                "big_cold",
            )
        if a.big_model and a.big_warm:
            runs["big_warm"] = doctor(
                ["--tier", "full", "--no-peak", "--model", a.big_model, "--tokens", str(a.tokens)],
                cache,
                log_dir,
                "big_warm",
            )
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    fig: dict[str, Any] = {}
    if a.model:
        cold, warm = runs["full_cold"], runs["full_warm"]
        fig.update(
            {
                "model": a.model,
                "quick_tier_s": runs["quick_warm"]["wall_s"],
                "full_tier_cold_s": cold["wall_s"],
                "full_tier_warm_s": warm["wall_s"],
                "full_tier_cold_over_warm": round(cold["wall_s"] / warm["wall_s"], 2)
                if warm["wall_s"]
                else None,
                "first_forward_cold_s": fwd(cold).get("first_forward_s"),
                "first_forward_warm_s": fwd(warm).get("first_forward_s"),
                "cache_entries_after_cold": cold["cache_entries"],
            }
        )
        if fig["first_forward_cold_s"] and fig["first_forward_warm_s"]:
            fig["first_forward_cold_over_warm"] = round(
                fig["first_forward_cold_s"] / fig["first_forward_warm_s"], 1
            )
    for tag in ("big_cold", "big_warm"):
        if tag in runs:
            ev = fwd(runs[tag])
            fig[tag] = {
                k: ev.get(k)
                for k in (
                    "params",
                    "load_s",
                    "first_forward_s",
                    "steady_forward_s",
                    "tokens",
                    "tokens_per_s",
                    "achieved_tflops",
                    "matmul_peak_tflops",
                    "mfu_vs_datasheet",
                    "mfu_vs_measured_matmul",
                    "gpu",
                )
            }
            fig[tag]["wall_s"] = runs[tag]["wall_s"]
    fig["runs"] = {
        k: {"rc": r["rc"], "wall_s": r["wall_s"], "root_cause": r["root_cause"]} for k, r in runs.items()
    }
    print(f"{'measure':42s} value")
    for k, v in fig.items():
        if k != "runs":
            print(f"{k:42s} {v}")
    for k, r in fig["runs"].items():
        rc = r["root_cause"]
        print(f"run {k:38s} rc={r['rc']} {r['wall_s']} s root_cause={rc['code'] if rc else None}")
    if a.output:
        Path(a.output).write_text(json.dumps(fig, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
