"""Training speed of stacks side by side: the 27B hybrid model's forward + backward step at full width,
each stack in its own process, rounds interleaved so every stack sees the same machine, in one run.

A stack is a name and the folders put first on PYTHONPATH (its FLA/Triton/... over the machine's own
packages; empty: the machine's own). Each stack runs with each short-convolution path asked for:
  torch  transformers' reference path (F.conv1d), what a venv without causal-conv1d gets
  fla    FLA's Triton causal_conv1d (a kernel every profile already carries), given to transformers as the
         `causal_conv1d` package it looks for; its output and gradients are checked against the torch path
and at two depths (the warm tier's 4 layers: 3 Gated DeltaNet + 1 full attention, and 8), so that the
full 64-layer step is estimated from the cost of one 4-layer block: t64 = t4 + 15 * (t8 - t4).

Printed: per stack and path, the step's median seconds, tokens/s and MFU against the matmul peak measured
in the same process (bf16 8192^3), the 64-layer estimate, and each row's speed as a ratio of the first.

  python3 verify/bench/train_speed.py --stack default=/tmp/site --conv torch,fla --json speed.json
  python3 verify/bench/train_speed.py --conv-only      # the short convolution alone, both paths
Needs a CUDA GPU; the doctor's sources (verify/src) are found from this file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

SRC = Path(__file__).resolve().parents[1] / "src"
WORKERS = SRC / "mlstack_doctor" / "workers"
CONFIG = SRC / "mlstack_doctor" / "configs" / "qwen3_5_27b.json"
MARK = "@@TRAIN_SPEED@@"
sys.path.insert(0, str(SRC))


# --- one measurement, in the stack's own process ------------------------------------------------------
def _fla_conv_package() -> None:
    """Give transformers FLA's Triton causal_conv1d as the `causal_conv1d` package it resolves at import
    (transformers passes [B, D, T]; FLA takes [B, T, D]). Only the training path (causal_conv1d_fn) is
    given: decoding's causal_conv1d_update stays on transformers' own."""
    import types

    from fla.modules.causal_conv1d import causal_conv1d as fla_conv

    def causal_conv1d_fn(
        x: Any, weight: Any, bias: Any = None, activation: str | None = None, **_: Any
    ) -> Any:
        y, _state = fla_conv(x.transpose(1, 2), weight, bias, activation=activation)
        return y.transpose(1, 2)

    mod = types.ModuleType("causal_conv1d")
    mod.causal_conv1d_fn = causal_conv1d_fn  # type: ignore[attr-defined]
    sys.modules["causal_conv1d"] = mod


def _conv_shape() -> tuple[int, int]:
    """The Gated DeltaNet short convolution's channels (q, k and v side by side) and kernel width."""
    from mlstack_doctor.cache.warm import warm_config

    t = warm_config(json.loads(CONFIG.read_text()), 0)
    keys = t["linear_num_key_heads"] * t["linear_key_head_dim"]
    return 2 * keys + t["linear_num_value_heads"] * t["linear_value_head_dim"], t["linear_conv_kernel_dim"]


def _conv_paths(torch: Any, batch: int, seq_len: int) -> tuple[Any, Any, Any, Any]:
    """Random input and weight at the model's conv width and kernel (requiring grad), and the two paths
    over them: transformers' reference (F.conv1d + SiLU, in the model's [B, D, T] layout) and FLA's kernel."""
    import torch.nn.functional as F
    from fla.modules.causal_conv1d import causal_conv1d as fla_conv

    (d, k), gen = _conv_shape(), torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(batch, seq_len, d, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)
    w = torch.randn(d, k, device="cuda", dtype=torch.bfloat16, generator=gen, requires_grad=True)

    def torch_path() -> Any:
        y = F.conv1d(x.transpose(1, 2), w.unsqueeze(1), padding=k - 1, groups=d)[:, :, :seq_len]
        return F.silu(y).transpose(1, 2)

    def fla_path() -> Any:
        return fla_conv(x, w, None, activation="silu")[0]

    return x, w, torch_path, fla_path


def _conv_agreement(torch: Any) -> dict[str, float]:
    """FLA's conv against the torch path at the model's conv width and kernel: output and gradients."""
    x, w, torch_path, fla_path = _conv_paths(torch, 1, 2048)
    ref, out = torch_path(), fla_path()
    g = torch.randn_like(ref)
    gx_ref, gw_ref = torch.autograd.grad(ref, (x, w), g)
    gx, gw = torch.autograd.grad(out, (x, w), g)

    def rel(a: Any, b: Any) -> float:
        a, b = a.detach().float(), b.detach().float()
        return float((a - b).abs().max() / b.abs().max().clamp_min(1e-6))

    return {"out": rel(out, ref), "grad_x": rel(gx, gx_ref), "grad_w": rel(gw, gw_ref)}


def _cuda_seconds(torch: Any, fn: Any, runs: int, after: Any = None) -> list[float]:
    """`fn` timed `runs` times with CUDA events; `after` (untimed) runs after each."""
    times = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        if after is not None:
            after()
        times.append(start.elapsed_time(end) / 1000)
    return times


def conv_only(seq_len: int, batch: int, steps: int) -> dict[str, Any]:
    """The short convolution alone, forward + backward at the model's width, each path timed with CUDA
    events in this one process: what one Gated DeltaNet layer pays for it per step."""
    import torch

    x, w, torch_path, fla_path = _conv_paths(torch, batch, seq_len)
    g = torch.randn_like(x)
    d, k = _conv_shape()
    out: dict[str, Any] = {"channels": d, "kernel": k, "seq_len": seq_len, "batch": batch}
    out["gpu"] = torch.cuda.get_device_name(0)
    for name, path in (("torch", torch_path), ("fla", fla_path)):

        def fwd_bwd(path: Any = path) -> None:
            torch.autograd.grad(path(), (x, w), g)

        for _ in range(3):
            fwd_bwd()
        out[f"{name}_ms"] = round(statistics.median(_cuda_seconds(torch, fwd_bwd, max(steps, 20))) * 1000, 3)
    out["conv_rel_error"] = _conv_agreement(torch)
    return out


def measure(conv: str, layers: int, seq_len: int, batch: int, steps: int) -> dict[str, Any]:
    import importlib.metadata as md

    import torch

    sys.path.insert(0, str(WORKERS))
    from mlstack_doctor.cache.warm import warm_config
    from w_model import _build, _config, _count_params, _flops_per_token, _ids, _matmul_peak, _train_step

    if conv == "fla":
        _fla_conv_package()  # before transformers' model code is imported

    out: dict[str, Any] = {
        "conv": conv,
        "layers": layers,
        "seq_len": seq_len,
        "batch": batch,
        "gpu": torch.cuda.get_device_name(0),
        "versions": {},
    }
    for dist in ("torch", "triton", "flash-linear-attention", "fla-core", "transformers"):
        try:
            out["versions"][dist] = md.version(dist)
        except md.PackageNotFoundError:
            out["versions"][dist] = None
    raw = json.loads(CONFIG.read_text())
    transformers, cfg = _config({"config_dict": warm_config(raw, layers)})
    _, full_cfg = _config({"config_dict": warm_config(raw, 0)})
    full_params, full_embed, _ = _count_params(torch, transformers, full_cfg)
    out["matmul_peak_tflops"] = round(_matmul_peak(torch), 1)
    if conv == "fla":
        out["conv_rel_error"] = _conv_agreement(torch)
    model = _build(torch, transformers, cfg, "cuda")
    model.train()
    params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    ids = _ids(torch, "cuda", int(cfg.vocab_size), batch, seq_len)
    t0 = time.perf_counter()
    for _ in range(2):  # compile, autotune, allocate
        _train_step(model, ids)
        model.zero_grad(set_to_none=True)
    torch.cuda.synchronize()
    out["warmup_s"] = round(time.perf_counter() - t0, 1)
    times = _cuda_seconds(
        torch, lambda: _train_step(model, ids), steps, after=lambda: model.zero_grad(set_to_none=True)
    )
    step = statistics.median(times)
    tokens = batch * seq_len
    # a training step: forward + backward = 3 forwards' matmul work
    flops = 3 * _flops_per_token(cfg, params - embed, seq_len) * tokens
    out.update(
        {
            "params": params,
            "step_s": round(step, 4),
            "step_spread": round((max(times) - min(times)) / step, 3),
            "tokens_per_s": round(tokens / step, 1),
            "mfu": round(flops / step / (out["matmul_peak_tflops"] * 1e12), 4),
            "peak_memory_gib": round(torch.cuda.max_memory_allocated() / 2**30, 1),
            "fla_in_use": "fla.ops.gated_delta_rule" in sys.modules,
            # the full model's work per step, for the 64-layer estimate's MFU
            "full_flops_per_step": 3 * _flops_per_token(full_cfg, full_params - full_embed, seq_len) * tokens,
            "full_layers": int(full_cfg.num_hidden_layers),
        }
    )
    return out


# --- the side-by-side run ---------------------------------------------------------------------------
def run_one(paths: str, conv: str, layers: int, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in [paths, str(SRC)] if p))
    cmd = [sys.executable, __file__, "--child", conv, str(layers), str(args.seq_len), str(args.batch)]
    cmd.append(str(args.steps))
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=args.timeout)
    for line in proc.stdout.splitlines():
        if line.startswith(MARK):
            return json.loads(line[len(MARK) :])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"conv": conv, "layers": layers, "error": f"rc {proc.returncode}: " + " | ".join(tail)[-600:]}


def estimate(r4: dict[str, Any], r8: dict[str, Any], tokens: int) -> dict[str, Any]:
    """The full model's step from a 4-layer and an 8-layer run: embedding, head and loss once, then one
    4-layer block's cost per 4 layers."""
    block = r8["step_s"] - r4["step_s"]
    step = r4["step_s"] + (r4["full_layers"] // 4 - 1) * block
    return {
        "step_s": round(step, 3),
        "tokens_per_s": round(tokens / step, 1),
        "mfu": round(r4["full_flops_per_step"] / step / (r4["matmul_peak_tflops"] * 1e12), 4),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stack", action="append", default=[], metavar="NAME=PATHS", help="repeatable")
    p.add_argument("--conv", default="torch,fla", help="short-convolution paths to run (torch, fla)")
    p.add_argument("--layers", default="4,8", help="depths to run; 4 and 8 give the 64-layer estimate")
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--rounds", type=int, default=1, help="times each combination runs, interleaved")
    p.add_argument("--timeout", type=int, default=600, help="seconds for one combination")
    p.add_argument("--json", metavar="FILE")
    p.add_argument(
        "--conv-only",
        action="store_true",
        help="time the short convolution alone (forward + backward, both paths) in this process",
    )
    p.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.conv_only:
        r = conv_only(args.seq_len, args.batch, args.steps)
        print(json.dumps(r))
        print(
            f"short conv fwd+bwd at {r['channels']} channels x {r['seq_len']} tokens on {r['gpu']}: torch "
            f"{r['torch_ms']} ms, FLA {r['fla_ms']} ms ({r['torch_ms'] / r['fla_ms']:.2f}x)"
        )
        if args.json:
            Path(args.json).write_text(json.dumps(r, indent=2))
        return 0
    if args.child:
        conv, layers, seq_len, batch, steps = args.child
        print(MARK + json.dumps(measure(conv, int(layers), int(seq_len), int(batch), int(steps))), flush=True)
        return 0
    stacks = [s.partition("=")[::2] for s in args.stack] or [("machine", "")]
    convs = args.conv.split(",")
    depths = [int(x) for x in args.layers.split(",")]
    results: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for _ in range(args.rounds):
        for name, paths in stacks:
            for conv in convs:
                for layers in depths:
                    r = run_one(paths, conv, layers, args)
                    results.setdefault((name, conv, layers), []).append(r)
                    print(
                        f"  {name} conv={conv} layers={layers}: "
                        + (r.get("error") or f"{r['step_s']} s/step")
                    )
    rows = []
    tokens = args.seq_len * args.batch
    for (name, conv, layers), rs in results.items():
        ok = [r for r in rs if "error" not in r]
        if not ok:
            rows.append({"stack": name, "conv": conv, "layers": layers, "error": rs[-1]["error"]})
            continue
        best = min(ok, key=lambda r: r["step_s"])  # the least disturbed round
        rows.append({"stack": name, **best})
    for name, _ in stacks:
        for conv in convs:
            pair = {
                r["layers"]: r for r in rows if r["stack"] == name and r["conv"] == conv and "error" not in r
            }
            if 4 in pair and 8 in pair:
                rows.append(
                    {"stack": name, "conv": conv, "layers": "64 (est.)", **estimate(pair[4], pair[8], tokens)}
                )
    base = next((r for r in rows if "error" not in r), None)
    print(
        f"\n{'stack':<12} {'conv':<6} {'layers':<10} {'s/step':>8} {'tokens/s':>10} {'MFU':>6} {'ratio':>8}"
    )
    for r in rows:
        if "error" in r:
            print(f"{r['stack']:<12} {r['conv']:<6} {r['layers']!s:<10} FAILED: {r['error'][:200]}")
            continue
        same = [b for b in rows if b.get("layers") == r["layers"] and "error" not in b]
        ratio = r["tokens_per_s"] / same[0]["tokens_per_s"] if same else 1.0
        print(
            f"{r['stack']:<12} {r['conv']:<6} {r['layers']!s:<10} {r['step_s']:>8.3f} "
            f"{r['tokens_per_s']:>10.0f} {r['mfu']:>6.1%} {ratio:>7.3f}x"
        )
    if base is not None:
        print(
            f"\nGPU {base.get('gpu')}, bf16 matmul peak {base.get('matmul_peak_tflops')} TFLOP/s (measured)"
        )
        for r in rows:
            if r.get("conv_rel_error"):
                print(f"FLA conv vs torch conv ({r['stack']}): relative max error {r['conv_rel_error']}")
            if r.get("versions") and r.get("layers") == 4:
                print(f"{r['stack']} conv={r['conv']}: {r['versions']}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"seq_len": args.seq_len, "batch": args.batch, "rows": rows}, indent=2)
        )
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
