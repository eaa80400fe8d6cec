"""The model tiers: does transformers know the config; a forward on the GPU; concurrent forwards.

Modes (args["mode"]):
  config   transformers builds the config (and, if torch is there, counts parameters on 'meta')
  forward  build from config (random init, directly on the GPU) or load real weights (device_map),
           forward `tokens` tokens, check logits; time load, first forward, steady forwards
  stress   N threads over the GPUs, each forwarding at the same moment (a barrier) on the cache
           the doctor gives (cold): catches the autotuner race (triton-lang/triton#11494)
"""

from __future__ import annotations

import json
import statistics
import threading
import time
import traceback
from typing import Any

from _common import error_text, main


def _config(args: dict[str, Any]) -> Any:
    import transformers

    with open(args["config"], encoding="utf-8") as f:
        raw = json.load(f)
    model_type = raw.get("model_type")
    cfg = transformers.AutoConfig.for_model(model_type, **{k: v for k, v in raw.items() if k != "model_type"})
    return transformers, cfg


def _count_params(torch: Any, transformers: Any, cfg: Any) -> tuple[int, int, Any]:
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    total = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight.numel()
    return total, embed, model


def _text_cfg(cfg: Any) -> Any:
    return cfg.get_text_config() if hasattr(cfg, "get_text_config") else cfg


def check_config(args: dict[str, Any]) -> dict[str, Any]:
    transformers, cfg = _config(args)
    text = _text_cfg(cfg)
    out: dict[str, Any] = {
        "transformers": transformers.__version__,
        "model_type": cfg.model_type,
        "config_class": type(cfg).__name__,
        "hidden_size": getattr(text, "hidden_size", None),
        "num_hidden_layers": getattr(text, "num_hidden_layers", None),
        "vocab_size": getattr(text, "vocab_size", None),
    }
    layer_types = getattr(text, "layer_types", None)
    if layer_types:
        out["layer_types"] = {t: layer_types.count(t) for t in sorted(set(layer_types))}
    try:
        import torch
    except ImportError:
        out["params"] = None
        return out
    total, embed, model = _count_params(torch, transformers, cfg)
    out.update({"params": total, "params_embedding": embed, "model_class": type(model).__name__})
    return out


def _flops_per_token(text: Any, params_dense: int, tokens: int) -> float:
    """2 FLOPs per weight per token for the matmuls, plus causal attention in the full-attention layers."""
    flops = 2.0 * params_dense
    layer_types = getattr(text, "layer_types", None) or ["full_attention"] * text.num_hidden_layers
    n_full = sum(1 for t in layer_types if t == "full_attention")
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    # QK^T and PV: 2 matmuls * 2 FLOPs, causal so half of T on average
    flops += n_full * 4.0 * text.num_attention_heads * head_dim * tokens / 2
    return flops


def _matmul_peak(torch: Any) -> float:
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        a @ b
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    reps = 20
    for _ in range(reps):
        a @ b
    end.record()
    torch.cuda.synchronize()
    secs = start.elapsed_time(end) / 1000 / reps
    del a, b
    torch.cuda.empty_cache()
    return 2 * n**3 / secs / 1e12


def check_forward(args: dict[str, Any]) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    transformers, cfg = _config(args)
    text = _text_cfg(cfg)
    total, embed, _ = _count_params(torch, transformers, cfg)
    tokens = int(args.get("tokens", 2048))
    vocab = int(text.vocab_size)
    need = total * 2 + tokens * vocab * 6 + 2 * 2**30
    free, total_mem = torch.cuda.mem_get_info(0)
    out.update(
        {
            "params": total,
            "params_embedding": embed,
            "weights_gb": round(total * 2 / 1e9, 1),
            "need_gib": round(need / 2**30, 1),
            "gpu_free_gib": round(free / 2**30, 1),
            "gpu_total_gib": round(total_mem / 2**30, 1),
            "gpu": torch.cuda.get_device_name(0),
            "tokens": tokens,
            "weights": "real" if args.get("weights_dir") else "random-init",
        }
    )
    if need > free:
        out.update({"ok": False, "refused": True, "error": "model does not fit in the GPU's free memory"})
        return out
    if args.get("measure_peak"):
        out["matmul_peak_tflops"] = round(_matmul_peak(torch), 1)
    t_load = time.perf_counter()
    if args.get("weights_dir"):
        model = transformers.AutoModelForCausalLM.from_pretrained(
            args["weights_dir"], dtype=torch.bfloat16, device_map="cuda:0", attn_implementation="sdpa"
        )
    else:
        torch.manual_seed(0)
        with torch.device("cuda:0"):
            model = transformers.AutoModelForCausalLM.from_config(
                cfg, dtype=torch.bfloat16, attn_implementation="sdpa"
            )
    model.eval()
    torch.cuda.synchronize()
    out["load_s"] = round(time.perf_counter() - t_load, 2)
    out["setup_s"] = round(time.perf_counter() - t0, 2)
    out["gpu_allocated_gib"] = round(torch.cuda.memory_allocated(0) / 2**30, 1)
    gen = torch.Generator(device="cuda").manual_seed(0)
    ids = torch.randint(0, vocab, (1, tokens), device="cuda", generator=gen)
    with torch.no_grad():
        t1 = time.perf_counter()
        logits = model(input_ids=ids, use_cache=False).logits
        torch.cuda.synchronize()
        out["first_forward_s"] = round(time.perf_counter() - t1, 2)
        out["logits_shape"] = list(logits.shape)
        out["logits_finite"] = bool(torch.isfinite(logits).all())
        del logits
        times = []
        for _ in range(int(args.get("repeats", 3))):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            model(input_ids=ids, use_cache=False)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1000)
    steady = statistics.median(times)
    out["steady_forward_s"] = round(steady, 4)
    out["tokens_per_s"] = round(tokens / steady, 1)
    out["achieved_tflops"] = round(_flops_per_token(text, total - embed, tokens) * tokens / steady / 1e12, 1)
    out["expected_logits_shape"] = [1, tokens, vocab]
    if out["logits_shape"] != out["expected_logits_shape"]:
        out.update(
            {"ok": False, "error": f"logits shape {out['logits_shape']} != {out['expected_logits_shape']}"}
        )
    elif not out["logits_finite"]:
        out.update({"ok": False, "error": "logits contain NaN or Inf"})
    return out


def _concurrent(
    torch: Any, models: list[Any], devices: list[int], n_threads: int, tokens: int, vocab: int
) -> dict:
    barrier = threading.Barrier(n_threads)
    errors: list[dict[str, Any]] = []
    lock = threading.Lock()

    def work(i: int) -> None:
        dev = devices[i % len(devices)]
        model = models[i % len(devices)]
        ids = torch.randint(0, vocab, (1, tokens), device=f"cuda:{dev}")
        barrier.wait()
        try:
            with torch.no_grad(), torch.cuda.device(dev):
                model(input_ids=ids, use_cache=False)
            torch.cuda.synchronize(dev)
        except Exception as exc:
            with lock:
                errors.append(
                    {
                        "thread": i,
                        "gpu": dev,
                        "error": error_text(exc),
                        "where": traceback.format_exc()[-1500:],
                    }
                )

    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return {"errors": errors, "seconds": round(time.perf_counter() - t0, 2)}


def check_stress(args: dict[str, Any]) -> dict[str, Any]:
    import torch

    transformers, cfg = _config(args)
    vocab = int(_text_cfg(cfg).vocab_size)
    n_threads = int(args.get("threads", 4))
    gpus = torch.cuda.device_count()
    devices = list(range(min(gpus, n_threads)))
    models = []
    for dev in devices:
        torch.manual_seed(0)
        with torch.device(f"cuda:{dev}"):
            models.append(transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval())
    tokens = int(args.get("tokens", 256))
    cold = _concurrent(torch, models, devices, n_threads, tokens, vocab)
    out: dict[str, Any] = {"threads": n_threads, "gpus": len(devices), "tokens": tokens, "cold": cold}
    if cold["errors"]:
        # The mitigation the fix names: one warm-up forward per GPU, then the same threads again.
        with torch.no_grad():
            for dev, model in zip(devices, models, strict=True):
                with torch.cuda.device(dev):
                    model(
                        input_ids=torch.randint(0, vocab, (1, tokens), device=f"cuda:{dev}"), use_cache=False
                    )
        out["after_warmup"] = _concurrent(torch, models, devices, n_threads, tokens, vocab)
        out["ok"] = False
        out["error"] = cold["errors"][0]["error"]
    return out


def check(args: dict[str, Any]) -> dict[str, Any]:
    mode = args.get("mode", "config")
    if mode == "config":
        return check_config(args)
    if mode == "forward":
        return check_forward(args)
    return check_stress(args)


if __name__ == "__main__":
    main(check)
