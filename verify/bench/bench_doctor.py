#!/usr/bin/env python3
"""Time the doctor, each measurement a fresh `python -m mlstack_doctor` process (as provisioning runs it).

In one run:
  issue 5   the bare `import torch, transformers, fla`; the full tier on a cold, then a warm Triton cache;
            the first forward cold vs warm (>= 10x?) and the warm full tier minus the bare import (<= 5 s?)
  --race    the autotuner race and its cure: the stress tier on a cold cache (expect AUTOTUNER_RACE), the
            warm tier on another cold cache (kernels tuned, time), the stress tier on that warmed cache
            (expect a pass), the warm tier again (expect "skipped: cache key already warm")
  --warm-model M   the warm tier for M (e.g. 27b: 4 layers at the 27B widths) on a cold cache
  --big-model M    the full tier for M: tok/s and MFU
Standard library only. Prints a table; --output writes the figures as JSON. --deadline S skips the
steps that would start after S seconds (the lent GPU's time is counted).

  python3 verify/bench/bench_doctor.py --race --model tiny --warm-model 27b --big-model '' --output b.json
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
    result = {
        "tag": tag,
        "rc": proc.returncode,
        "wall_s": round(wall, 1),
        "probes": probes,
        "root_cause": (report.get("summary") or {}).get("root_cause"),
        "cache_entries": entries,
    }
    # Each run's headline at once: a run cut short (the GPU lease ends) keeps what it printed.
    first = fwd(result).get("first_forward_s")
    root = (result["root_cause"] or {}).get("code")
    print(f"  {tag}: rc={proc.returncode} {wall:.1f} s first_forward_s={first} root_cause={root}", flush=True)
    return result


def bare_import(cache: str) -> float:
    """Wall time of a fresh `python -c 'import torch, transformers, fla'` (what no doctor can avoid)."""
    env = dict(os.environ, TRITON_CACHE_DIR=cache)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", "import torch, transformers, fla"], env=env, capture_output=True, text=True
    )
    wall = time.perf_counter() - t0
    print(f"  bare import: rc={proc.returncode} {wall:.1f} s", flush=True)
    return round(wall, 1) if proc.returncode == 0 else float("nan")


def probe(run: dict[str, Any], name: str) -> dict[str, Any]:
    return run["probes"].get(name) or {}


def fwd(run: dict[str, Any]) -> dict[str, Any]:
    return probe(run, "model_forward").get("evidence", {})


def stress_fig(run: dict[str, Any]) -> dict[str, Any]:
    p = probe(run, "autotune_stress")
    ev = p.get("evidence", {})
    cold = ev.get("cold") or {}
    return {
        "wall_s": run["wall_s"],
        "status": p.get("status"),
        "code": p.get("code"),
        "summary": p.get("summary"),
        "cache_state": (ev.get("cache") or {}).get("state"),
        "threads": ev.get("threads"),
        "failed_threads": len({e["thread"] for e in cold.get("errors", [])}),
        "concurrent_s": cold.get("seconds"),
        "mitigation": ev.get("warm_cache_mitigation"),
        "after_warmup_s": (ev.get("after_warmup") or {}).get("seconds"),
    }


def warm_fig(run: dict[str, Any]) -> dict[str, Any]:
    p = probe(run, "triton_warm")
    ev = p.get("evidence", {})
    return {
        "wall_s": run["wall_s"],
        "probe_s": p.get("duration_s"),
        "status": p.get("status"),
        "code": p.get("code"),
        "action": ev.get("action"),
        "reason": ev.get("reason"),
        "warm_seconds": ev.get("seconds"),
        "kernel_configs_tuned": ev.get("autotune_files_new"),
        "kernels": len(ev.get("tuned_kernels") or []),
        "backward": ev.get("backward"),
        "layers": f"{ev.get('layers_warmed')} of {ev.get('layers_full')}",
        "shapes": ev.get("shapes"),
        "summary": p.get("summary"),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model", default="tiny", help="model for the cold/warm full tier and --race ('' to skip)"
    )
    ap.add_argument("--big-model", default="", help="model for tok/s and MFU ('' to skip)")
    ap.add_argument("--warm-model", default="", help="also warm this model on a cold cache (e.g. 27b)")
    ap.add_argument("--race", action="store_true", help="stress cold, warm, stress warm, warm again")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--seq-len", default="2048", help="warm/stress shapes (comma-separated)")
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--deadline", type=float, default=0, help="skip steps starting after this many seconds")
    ap.add_argument("--output", default=None)
    ap.add_argument("--logs", default=None, help="folder for each run's report and table")
    a = ap.parse_args()
    log_dir = Path(a.logs or tempfile.mkdtemp(prefix="mlstack-bench-logs-"))
    log_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    caches: list[str] = []
    fig: dict[str, Any] = {}
    runs: dict[str, dict[str, Any]] = {}

    def cold_cache() -> str:
        caches.append(tempfile.mkdtemp(prefix="mlstack-bench-cache-"))
        return caches[-1]

    def in_time(step: str) -> bool:
        left = a.deadline - (time.perf_counter() - t_start) if a.deadline else 1
        if left <= 0:
            fig.setdefault("skipped_for_time", []).append(step)
            print(f"  {step}: skipped (deadline {a.deadline:.0f} s passed)", flush=True)
        return left > 0

    shapes = ["--seq-len", a.seq_len]
    stress = [
        "--tier",
        "stress",
        "--only",
        "model_config,autotune_stress",
        "--threads",
        str(a.threads),
        *shapes,
    ]
    try:
        if a.race and a.model and in_time("race"):
            m = ["--model", a.model]
            runs["stress_cold"] = doctor([*stress, *m], cold_cache(), log_dir, "stress_cold")
            warmed = cold_cache()
            runs["warm"] = doctor(["--tier", "warm", *m, *shapes], warmed, log_dir, "warm")
            runs["stress_warm"] = doctor([*stress, *m], warmed, log_dir, "stress_warm")
            runs["warm_again"] = doctor(["--tier", "warm", *m, *shapes], warmed, log_dir, "warm_again")
            fig["race"] = {
                "model": a.model,
                "stress_cold": stress_fig(runs["stress_cold"]),
                "warm": warm_fig(runs["warm"]),
                "stress_warm": stress_fig(runs["stress_warm"]),
                "warm_again": warm_fig(runs["warm_again"]),
            }
        if a.model and in_time("full tier cold/warm"):
            cache = cold_cache()
            common = ["--tier", "full", "--no-peak", "--model", a.model, "--tokens", str(a.tokens)]
            runs["full_cold"] = doctor(common, cache, log_dir, "full_cold")
            fig["bare_import_s"] = bare_import(cache)
            runs["full_warm"] = doctor(common, cache, log_dir, "full_warm")
            cold, warm = runs["full_cold"], runs["full_warm"]
            fig.update(
                {
                    "model": a.model,
                    "full_tier_cold_s": cold["wall_s"],
                    "full_tier_warm_s": warm["wall_s"],
                    "full_tier_cold_over_warm": round(cold["wall_s"] / warm["wall_s"], 2)
                    if warm["wall_s"]
                    else None,
                    "full_tier_warm_minus_bare_import_s": round(warm["wall_s"] - fig["bare_import_s"], 1),
                    "first_forward_cold_s": fwd(cold).get("first_forward_s"),
                    "first_forward_warm_s": fwd(warm).get("first_forward_s"),
                    "cache_entries_after_cold": cold["cache_entries"],
                    "session_imports_s": (
                        probe(warm, "torch_cuda").get("evidence", {}).get("session") or {}
                    ).get("imports_s"),
                }
            )
            if fig["first_forward_cold_s"] and fig["first_forward_warm_s"]:
                fig["first_forward_cold_over_warm"] = round(
                    fig["first_forward_cold_s"] / fig["first_forward_warm_s"], 1
                )
            fig["goal_first_forward_10x"] = (fig.get("first_forward_cold_over_warm") or 0) >= 10
            fig["goal_full_warm_within_5s_of_bare_import"] = fig["full_tier_warm_minus_bare_import_s"] <= 5
        if a.warm_model and in_time(f"warm {a.warm_model}"):
            runs["warm_big"] = doctor(
                ["--tier", "warm", "--model", a.warm_model, *shapes], cold_cache(), log_dir, "warm_big"
            )
            fig["warm_big"] = {"model": a.warm_model, **warm_fig(runs["warm_big"])}
        if a.big_model and in_time(f"full {a.big_model}"):
            runs["big_cold"] = doctor(
                ["--tier", "full", "--model", a.big_model, "--tokens", str(a.tokens)],
                cold_cache(),
                log_dir,
                "big",
            )
            ev = fwd(runs["big_cold"])
            fig["big_cold"] = {
                k: ev.get(k)
                for k in (
                    "params",
                    "load_s",
                    "first_forward_s",
                    "steady_forward_s",
                    "tokens_per_s",
                    "achieved_tflops",
                )
            }
    finally:
        for c in caches:
            shutil.rmtree(c, ignore_errors=True)
    fig["runs"] = {
        k: {"rc": r["rc"], "wall_s": r["wall_s"], "root_cause": r["root_cause"]} for k, r in runs.items()
    }
    fig["bench_s"] = round(time.perf_counter() - t_start, 1)
    print(f"{'measure':42s} value")
    for k, v in fig.items():
        if k == "race":
            for step, f in v.items():
                print(f"race.{step:37s} {f}")
        elif k != "runs":
            print(f"{k:42s} {v}")
    for k, r in fig["runs"].items():
        rc = r["root_cause"]
        print(f"run {k:38s} rc={r['rc']} {r['wall_s']} s root_cause={rc['code'] if rc else None}")
    if a.output:
        Path(a.output).write_text(json.dumps(fig, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
