"""mlstack-doctor: prove the GPU ML stack works, or name the root cause and the one-line fix."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from dataclasses import replace

from mlstack_doctor import __version__, engine, procenv, profile, render, reuse, settings
from mlstack_doctor.context import Context, Options
from mlstack_doctor.engine import Probe
from mlstack_doctor.files import write_atomic
from mlstack_doctor.ops import metrics
from mlstack_doctor.record import Result, Stage, Status

EXIT_OK, EXIT_FAILED, EXIT_CANNOT_RUN = 0, 1, 2

EPILOG = """\
exit codes:
  0  every probe passed (warnings allowed)
  1  a probe failed: the report names the root cause (summary.root_cause) and its fix
  2  the doctor itself could not run (bad arguments, unreadable --profile or settings file, internal
     error)

defaults:
  In a provisioned container the doctor role writes /etc/mlstack/doctor.json (MLSTACK_DOCTOR_SETTINGS
  names another file; empty: none): --profile (the lock the venv was built from), --model, --purpose,
  --no-gpu and --triton-cache-root default to it; flags given still win. Elsewhere, without --profile,
  no pins are checked: only combinations known not to work (FLA against its fla-core, torch's triton
  pin, the stack policy's rules for the GPUs seen), and the report names the shipped profile the stack
  matches (package_versions: matches_shipped).

tiers:
  fast    host (device nodes, driver through NVML, CUDA_VISIBLE_DEVICES), toolchain, Triton cache,
          package versions and torch's triton pin from metadata: never imports torch, Triton, FLA or
          transformers (about a second; monitoring)
  quick   host, toolchain, packages, torch CUDA, Triton target, FLA device/kernel, GDN backward,
          model config (no model is run)
  full    quick + a model forward on the GPU (random init from config, or real weights)
  stress  full + N threads running the training passes at once (autotuner race): on the shared
          Triton cache (default; a warmed cache must pass) or a fresh empty one (--stress-cache fresh)
  warm    host, toolchain, packages, model config, then the warm step: in ONE thread, forward and
          backward at the training shapes (--seq-len, --batch-size) of a depth-reduced copy of the
          config (same widths), so every autotuned kernel is tuned and on disk before training starts
          several threads; skipped when its cache key (GPU, torch/triton/FLA/transformers, config,
          shapes) is already warm in TRITON_CACHE_DIR; with --warm-share, installed from the cluster's
          cache when it holds the key (checked first), and published to it after a sound warm
  nccl    host probes, then torch.distributed across the GPUs, one spawned process per GPU: the GPUs
          CUDA sees against those passed through, /dev/shm for NCCL, the link type (nvidia-smi topo
          -m), all-reduce and all-gather checked against exact values, and a bus bandwidth sweep
          (nccl-tests' algbw/busbw) against the link type's floor. --nccl-backend gloo (automatic
          under --no-gpu) runs the same on the CPU with --nccl-ranks processes

The GPU probes run in ONE worker process that imports torch, Triton, transformers and FLA once
(MLSTACK_DOCTOR_SESSION=0: one process per probe); triton_target keeps its own fresh-cache process.

--model: tiny | 27b (shipped Qwen3.5 configs) | a config.json | a directory with config.json
(+ *.safetensors: real weights are loaded with device_map).
"""


def _shipped_names() -> str:
    """The shipped profiles' names for --help; why there are none where they cannot be read."""
    try:
        return ", ".join(sorted(profile.shipped()))
    except profile.ProfileError as exc:
        return f"not readable here: {exc}"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="mlstack-doctor",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--tier", choices=engine.TIERS, default="quick")
    p.add_argument(
        "--model", default=None, help="tiny | 27b | PATH (default: the settings' model, else tiny)"
    )
    gpu = p.add_mutually_exclusive_group()
    gpu.add_argument(
        "--expect-gpu",
        dest="expect_gpu",
        action="store_true",
        default=None,
        help="a GPU must be usable (default, unless the settings say expect_gpu: false)",
    )
    gpu.add_argument(
        "--no-gpu",
        dest="expect_gpu",
        action="store_false",
        help="CPU-only host: GPU probes skip, the toolchain and packages are still checked",
    )
    p.add_argument(
        "--profile",
        default=None,
        metavar="NAME|default|LOCK|DIR",
        help="expected versions: a shipped profile's name, 'default' (the stack policy's default "
        f"profile; shipped: {_shipped_names()}), or a uv.lock / a directory holding "
        "one (default: the settings' lock, else no pins of ours)",
    )
    p.add_argument(
        "--purpose",
        choices=settings.PURPOSES,
        default=None,
        help=f"what the stack is for: training (a backward FLA refuses fails) or inference (forward only; "
        f"a refused backward is a warning); default: the settings' purpose, else {settings.DEFAULT_PURPOSE}",
    )
    p.add_argument("--json", action="store_true", help="print the JSON report on stdout (no table)")
    p.add_argument("--output", metavar="FILE", help="also write the JSON report to FILE")
    p.add_argument(
        "--metrics",
        metavar="FILE",
        help="also write Prometheus metrics to FILE (node_exporter textfile collector; the latest run "
        "of each tier is kept)",
    )
    p.add_argument("--threads", type=int, default=4, help="stress tier: threads over the GPUs (default 4)")
    p.add_argument(
        "--seq-len",
        type=_int_list,
        default=[2048],
        metavar="N[,N]",
        help="warm and stress tiers: training sequence length(s) (default 2048)",
    )
    p.add_argument(
        "--batch-size", type=int, default=1, help="warm and stress tiers: training batch size (default 1)"
    )
    p.add_argument(
        "--warm-layers",
        type=int,
        default=None,
        metavar="N",
        help="warm and stress tiers: layers of the depth-reduced config "
        "(default: one of each layer type, 4 for Qwen3.5; 0: full depth)",
    )
    p.add_argument(
        "--stress-cache",
        choices=("shared", "fresh"),
        default="shared",
        help="stress tier: the TRITON_CACHE_DIR training uses (default) or a fresh empty cache",
    )
    p.add_argument(
        "--triton-cache-root",
        metavar="DIR",
        help="set TRITON_CACHE_DIR to DIR/<name of the venv this doctor runs in, links resolved>: the cache "
        "of the active venv, as provisioning lays it out (default: the settings' triton_cache_root)",
    )
    p.add_argument("--rewarm", action="store_true", help="warm tier: warm even when the cache key is warm")
    p.add_argument(
        "--warm-share",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="warm tier: the cluster's cache, <key>.tar.gz + <key>.json per warmed key (without DIR: the "
        "node's own, <TRITON_CACHE_DIR>/mlstack-share): a cold key it holds is checked and installed instead "
        "of warmed; a sound warm it lacks is published to it. Runs under --no-gpu too (nothing is warmed)",
    )
    p.add_argument(
        "--warm-plan",
        action="store_true",
        help="warm tier: decide, and install what --warm-share holds for the key, but never warm "
        "(evidence.action 'planned' names the key to fetch); the model config is parsed, not built",
    )
    p.add_argument(
        "--repair",
        action="store_true",
        help="move kernel-cache entries that cannot be loaded aside, inside the cache "
        "(<cache>/mlstack-quarantine/<time>/); nothing is deleted",
    )
    p.add_argument(
        "--tokens", type=int, default=2048, help="full tier: tokens in the timed forward (default 2048)"
    )
    p.add_argument(
        "--no-peak", dest="measure_peak", action="store_false", help="skip the bf16 matmul peak measurement"
    )
    p.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every probe timeout")
    p.add_argument(
        "--only",
        metavar="PROBE[,PROBE]",
        default=None,
        help="run only these probes (debugging: prerequisites that are not listed do not gate them)",
    )
    p.add_argument(
        "--reuse-passed",
        metavar="REPORT",
        default=None,
        help="quick and full tiers: when REPORT (the last run's) passed at this tier on the same stack "
        "fingerprint, run only the fast tier and carry the other verdicts over (a rerun on an "
        "unchanged stack); anything else runs the tier in full",
    )
    p.add_argument(
        "--reuse-max-age",
        type=float,
        default=24.0,
        metavar="HOURS",
        help="--reuse-passed: carry verdicts only from a run this recent (default 24)",
    )
    p.add_argument(
        "--nccl-backend",
        choices=("auto", "nccl", "gloo"),
        default="auto",
        help="nccl tier: torch.distributed backend (default auto: nccl, gloo under --no-gpu)",
    )
    p.add_argument(
        "--nccl-ranks",
        type=int,
        default=None,
        metavar="N",
        help="nccl tier: processes (gloo, default 2); with nccl at most N GPUs (default every GPU CUDA sees)",
    )
    p.add_argument(
        "--nccl-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="nccl tier: seconds each collective, and joining the process group, may take (default 60)",
    )
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.add_argument("--version", action="version", version=f"mlstack-doctor {__version__}")
    return p


def _int_list(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"needs integers >= 1: {text!r}")
    return values


def _note(quiet: bool):
    def show(text: str) -> None:
        if not quiet:
            sys.stderr.write(f"      {text}\n")
            sys.stderr.flush()

    return show


def _progress(quiet: bool):
    def show(i: int, n: int, probe: Probe) -> None:
        if not quiet:
            why = "torch in every rank" if probe.stage is Stage.NCCL else "JIT/autotune"
            hint = f" (slow: {why})" if probe.slow else ""
            sys.stderr.write(f"[{i + 1}/{n}] {probe.stage.value}: {probe.name}...{hint}\n")
            sys.stderr.flush()

    return show


def _done(quiet: bool):
    def show(r: Result) -> None:
        if not quiet and r.status is not Status.SKIP:
            sys.stderr.write(f"      {r.status.value}: {r.summary[:160]}\n")
            sys.stderr.flush()

    return show


def with_defaults(args: argparse.Namespace, found: settings.Settings | None) -> argparse.Namespace:
    """`args` with what was not given taken from the settings file, then from the doctor's own defaults."""
    s = found or settings.Settings(source="")
    return argparse.Namespace(
        **{
            **vars(args),
            # No settings file, no --profile: no pins of ours (a venv's own uv.lock is not read then).
            "profile": args.profile if args.profile is not None else found.lock_for() if found else None,
            "model": args.model if args.model is not None else s.model,
            "purpose": args.purpose or s.purpose or settings.DEFAULT_PURPOSE,
            "expect_gpu": args.expect_gpu if args.expect_gpu is not None else s.expect_gpu is not False,
            "triton_cache_root": args.triton_cache_root or s.triton_cache_root,
            "settings": s.source or None,
        }
    )


def main(argv: list[str] | None = None) -> int:
    parsed = build_parser().parse_args(argv)
    try:
        args = with_defaults(parsed, settings.load())
        prof = profile.load(args.profile)
    except (settings.SettingsError, profile.ProfileError) as exc:
        sys.stderr.write(f"mlstack-doctor: cannot run: {exc}\n")
        return EXIT_CANNOT_RUN
    if args.threads < 1 or args.tokens < 1 or args.batch_size < 1:
        sys.stderr.write("mlstack-doctor: cannot run: --threads, --tokens and --batch-size must be >= 1\n")
        return EXIT_CANNOT_RUN
    if (args.nccl_ranks is not None and args.nccl_ranks < 1) or args.nccl_timeout <= 0:
        sys.stderr.write("mlstack-doctor: cannot run: --nccl-ranks must be >= 1, --nccl-timeout > 0\n")
        return EXIT_CANNOT_RUN
    if args.warm_layers is not None and args.warm_layers < 0:
        sys.stderr.write("mlstack-doctor: cannot run: --warm-layers must be >= 0\n")
        return EXIT_CANNOT_RUN
    if args.triton_cache_root:
        # Set before anything reads it: the probes and the workers they start inherit it.
        venv_name = os.path.basename(os.path.realpath(sys.prefix))
        procenv.set_by_doctor("TRITON_CACHE_DIR", os.path.join(args.triton_cache_root, venv_name))
    names = {p.name for p in engine.PROBES}
    only = [n.strip() for n in args.only.split(",") if n.strip()] if args.only else None
    if only and not set(only) <= names:
        sys.stderr.write(f"mlstack-doctor: cannot run: unknown probe(s) {sorted(set(only) - names)}\n")
        return EXIT_CANNOT_RUN
    opts = Options(
        tier=args.tier,
        expect_gpu=args.expect_gpu,
        model=args.model,
        profile=prof,
        threads=args.threads,
        tokens=args.tokens,
        seq_lens=args.seq_len,
        batch_size=args.batch_size,
        warm_layers=args.warm_layers,
        stress_cache=args.stress_cache,
        rewarm=args.rewarm,
        timeout_scale=args.timeout_scale,
        measure_peak=args.measure_peak,
        only=only,
        purpose=args.purpose,
        nccl_backend=args.nccl_backend,
        nccl_ranks=args.nccl_ranks,
        nccl_timeout=args.nccl_timeout,
        repair=args.repair,
        warm_share=args.warm_share,
        warm_plan=args.warm_plan,
    )
    options = {
        "tier": args.tier,
        "expect_gpu": args.expect_gpu,
        "model": args.model,
        "profile": args.profile,
        "threads": args.threads,
        "tokens": args.tokens,
        "seq_lens": args.seq_len,
        "batch_size": args.batch_size,
        "warm_layers": args.warm_layers,
        "stress_cache": args.stress_cache,
        "rewarm": args.rewarm,
        "only": only,
        "purpose": args.purpose,
        "nccl_backend": args.nccl_backend,
        "nccl_ranks": args.nccl_ranks,
        "nccl_timeout": args.nccl_timeout,
        "repair": args.repair,
        "triton_cache_dir": os.environ.get("TRITON_CACHE_DIR"),
        "settings": args.settings,
    }
    # Recorded only when given: the reports and stack fingerprints of runs without them stay as they were.
    if args.warm_share is not None:
        options["warm_share"] = args.warm_share
    if args.warm_plan:
        options["warm_plan"] = True
    started = render.now()
    try:
        fp = reuse.fingerprint(options)
        prev = (
            reuse.reusable(args.reuse_passed, args.tier, fp, args.reuse_max_age)
            if args.reuse_passed
            else None
        )
        results = None
        if prev is not None and not only:
            fast = engine.run(Context(replace(opts, tier="fast")), _progress(args.quiet), _done(args.quiet))
            if engine.summarize(fast)["ok"]:
                since = reuse.original_run(prev)
                _note(args.quiet)(f"stack unchanged since {since}: fast tier passed, other verdicts carried")
                results = reuse.merge(fast, prev)
        if results is None:
            prev = None
            results = engine.run(Context(opts), _progress(args.quiet), _done(args.quiet), _note(args.quiet))
    except Exception:
        sys.stderr.write("mlstack-doctor: internal error, cannot run:\n" + traceback.format_exc())
        return EXIT_CANNOT_RUN
    summary = engine.summarize(results)
    doc = render.report(args.tier, options, started, results, summary)
    doc["fingerprint"] = fp
    if prev is not None:
        doc["reused"] = {"from": reuse.original_run(prev), "fast_tier_probes": list(engine.FAST_TIER)}
    if args.output:
        try:
            # Atomic: a second run of the doctor (a concurrent provision run) may write the same file.
            write_atomic(args.output, render.json_text(doc))
        except OSError as exc:
            sys.stderr.write(f"mlstack-doctor: cannot write {args.output}: {exc}\n")
            return EXIT_CANNOT_RUN
    if args.metrics:
        try:
            metrics.write(args.metrics, doc)
        except OSError as exc:
            sys.stderr.write(f"mlstack-doctor: cannot write {args.metrics}: {exc}\n")
            return EXIT_CANNOT_RUN
    if args.json:
        render.write_json(doc, sys.stdout)
    else:
        render.table(results, summary, sys.stdout)
    return EXIT_OK if summary["ok"] else EXIT_FAILED


if __name__ == "__main__":
    raise SystemExit(main())
