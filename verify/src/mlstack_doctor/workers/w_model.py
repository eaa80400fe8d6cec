"""The model tiers: does transformers know the config; a forward on the GPU; warming; concurrent passes.

Modes (args["mode"]):
  config   transformers builds the config (and, if torch is there, counts parameters on 'meta'); with
           args["checkpoint"] (a JSON file: tensor -> {shape, dtype, file}, read from the safetensors
           headers by the doctor) compares every tensor with the 'meta' model, keys renamed as
           transformers' own loader renames them
  forward  build from config (random init, directly on the GPU) or load real weights (device_map),
           forward `tokens` tokens, check logits; time load, first forward, steady forwards
  warm     ONE thread: at each training shape (seq_lens x batch), a forward (no grad) and a training
           forward + backward, so every autotuned Triton/FLA kernel the training calls has its tuned
           config and binary in TRITON_CACHE_DIR; a refused backward is reported, not raised
  stress   N threads over the GPUs, each running the same passes at the same moment (a barrier) on the
           cache the doctor gives: catches the autotuner race (triton-lang/triton#11494)

The config comes as a path (args["config"]) or as the dict itself (args["config_dict"]: the warm and
stress tiers pass a depth-reduced copy). args["device"] == "cpu" runs warm/stress on the CPU (tests).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import statistics
import sys
import threading
import time
import traceback
import types
from typing import Any

from _common import STATE, error_text, main, progress


def _config(args: dict[str, Any]) -> Any:
    import transformers

    if args.get("config_dict") is not None:
        raw = dict(args["config_dict"])
    else:
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
    # A second `import torch` after one that failed half-way re-runs torch/__init__.py over the live
    # C++ state and fails with nonsense ("module functions cannot set METH_CLASS or METH_STATIC"):
    # report the first failure, which names the cause.
    earlier = {m: e for m, e in STATE.get("import_errors", {}).items() if m in ("torch", "transformers")}
    if earlier:
        raise ImportError(
            "; ".join(f"import {m} failed earlier in this process: {e}" for m, e in earlier.items())
            + " (not retried: a package that failed half-way cannot be imported again)"
        )
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
    if args.get("checkpoint"):
        with open(args["checkpoint"], encoding="utf-8") as f:
            out["weights_check"] = compare_checkpoint(cfg, model, json.load(f))
    return out


SHOWN = 10  # tensors named per kind of difference; the counts say how many there are


def _renamer(model: Any) -> Any:
    """checkpoint key -> (model key, matched by a converter?), as transformers' loader renames it."""
    from transformers.conversion_mapping import get_model_conversion_mapping
    from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

    mapping = get_model_conversion_mapping(model)
    renamings = [m for m in mapping if isinstance(m, WeightRenaming)]
    converters = [m for m in mapping if isinstance(m, WeightConverter)]
    expected = model.state_dict()
    prefix = model.base_model_prefix

    def rename(key: str) -> tuple[str, bool]:
        new, pattern = rename_source_key(key, renamings, converters, prefix, expected)
        if new not in expected and key in expected:  # the loader's own fallback: the key as it is
            new, pattern = rename_source_key(key, [], [], base_model_prefix=prefix, meta_state_dict=expected)
        return new, pattern is not None

    return rename


def compare_checkpoint(cfg: Any, model: Any, tensors: dict[str, dict[str, Any]]) -> dict:
    """Every checkpoint tensor against the model the config builds: missing, unexpected, shapes, dtypes.

    The rules are transformers' loader's: keys renamed by the model's conversion mapping (a multimodal
    checkpoint's `model.language_model.` prefix, the base model prefix added or dropped), tied weights
    need only their source, the model's `_keys_to_ignore_on_load_*` patterns apply. A tensor a converter
    fuses or splits (MoE experts) is matched by name, its shape not compared (the converter reshapes it).
    """
    quant = getattr(cfg, "quantization_config", None)
    if quant:
        method = (
            quant.get("quant_method") if isinstance(quant, dict) else getattr(quant, "quant_method", None)
        )
        return {
            "compared": False,
            "why": f"a quantized checkpoint ({method}): its quantizer changes the layout",
        }
    expected = model.state_dict()
    buffers = {k for k, _ in model.named_buffers()}
    rename = _renamer(model)
    loaded: set[str] = set()
    converted_modules: set[str] = set()
    unexpected: set[str] = set()
    mismatched: list[dict[str, Any]] = []
    dtypes: list[dict[str, Any]] = []
    for key in sorted(tensors):
        entry = tensors[key]
        target, by_converter = rename(key)
        if target not in expected:
            unexpected.add(key)
            continue
        loaded.add(target)
        if by_converter:
            converted_modules.add(target.rsplit(".", 2)[0])
            continue
        want = expected[target]
        if list(want.shape) != list(entry["shape"]):
            mismatched.append(
                {
                    "tensor": key,
                    "checkpoint": entry["shape"],
                    "model": list(want.shape),
                    "file": entry["file"],
                }
            )
        # A float tensor of another width is cast at load; an integer one in a float parameter is a
        # quantized layout the config does not declare.
        if want.is_floating_point() and not str(entry["dtype"]).startswith(("F", "BF")):
            dtypes.append(
                {"tensor": key, "checkpoint": entry["dtype"], "model": str(want.dtype), "file": entry["file"]}
            )
    missing = set(expected) - loaded - buffers
    missing = {k for k in missing if k.rsplit(".", 2)[0] not in converted_modules}
    tied = dict(getattr(model, "all_tied_weights_keys", None) or {})
    missing -= {target for target, source in tied.items() if source not in missing}

    # transformers' own clean-up of the two lists (its ignore patterns, old rotary buffers)
    info = types.SimpleNamespace(missing_keys=missing, unexpected_keys=set(unexpected))
    if hasattr(model, "_adjust_missing_and_unexpected_keys"):
        model._adjust_missing_and_unexpected_keys(info)
    missing, ignored = set(info.missing_keys), len(unexpected) - len(info.unexpected_keys)
    unexpected = set(info.unexpected_keys)
    return {
        "compared": True,
        "checkpoint_tensors": len(tensors),
        "model_tensors": len(expected),
        "converted": sum(1 for k in tensors if rename(k)[1]),
        "missing_count": len(missing),
        "missing": sorted(missing)[:SHOWN],
        "unexpected_count": len(unexpected),
        "unexpected": sorted(unexpected)[:SHOWN],
        "unexpected_ignored": ignored,
        "mismatched_count": len(mismatched),
        "mismatched": mismatched[:SHOWN],
        "dtype_mismatched_count": len(dtypes),
        "dtype_mismatched": dtypes[:SHOWN],
        "buffers_absent": len((set(expected) & buffers) - loaded),
    }


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


def _devices(torch: Any, args: dict[str, Any], limit: int | None = None) -> list[str]:
    """One device per distinct GPU architecture (Triton's cache is per arch), or the listed ones."""
    if args.get("device") == "cpu":
        return ["cpu"]
    if args.get("devices"):
        return [f"cuda:{int(i)}" for i in args["devices"]]
    if limit is not None:
        return [f"cuda:{i}" for i in range(min(torch.cuda.device_count(), limit))]
    first: dict[tuple[int, int], int] = {}
    for i in range(torch.cuda.device_count()):
        first.setdefault(tuple(torch.cuda.get_device_capability(i)), i)
    return [f"cuda:{i}" for i in first.values()]


def _on(torch: Any, dev: str) -> Any:
    """Make `dev` the thread's current CUDA device: Triton launches on the current device."""
    return torch.cuda.device(dev) if dev.startswith("cuda") else contextlib.nullcontext()


def _sync(torch: Any, dev: str) -> None:
    if dev.startswith("cuda"):
        torch.cuda.synchronize(dev)


def _build(torch: Any, transformers: Any, cfg: Any, dev: str) -> Any:
    torch.manual_seed(0)
    with torch.device(dev):
        return transformers.AutoModelForCausalLM.from_config(
            cfg, dtype=torch.bfloat16, attn_implementation="sdpa"
        )


def _ids(torch: Any, dev: str, vocab: int, batch: int, seq_len: int, seed: int = 0) -> Any:
    gen = torch.Generator(device=dev).manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq_len), device=dev, generator=gen)


def _autotune_files(cache_dir: str) -> set[str]:
    """`<entry>/<kernel>.autotune.json` files: one per (kernel, autotune key) tuned and kept on disk."""
    found: set[str] = set()
    if not cache_dir or not os.path.isdir(cache_dir):
        return found
    with os.scandir(cache_dir) as entries:
        for entry in entries:
            if not entry.is_dir(follow_symlinks=False):
                continue
            try:
                with os.scandir(entry.path) as files:
                    found.update(f"{entry.name}/{f.name}" for f in files if f.name.endswith(".autotune.json"))
            except OSError:
                continue
    return found


def _train_step(model: Any, ids: Any) -> None:
    """A training step's passes: forward with the loss, then backward (gradients are dropped after)."""
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()


def check_warm(args: dict[str, Any]) -> dict[str, Any]:
    import torch

    transformers, cfg = _config(args)
    text = _text_cfg(cfg)
    vocab = int(text.vocab_size)
    seq_lens = [int(x) for x in args.get("seq_lens", [2048])]
    batch = int(args.get("batch", 1))
    cache = os.environ.get("TRITON_CACHE_DIR", "")
    before = _autotune_files(cache)
    out: dict[str, Any] = {
        "seq_lens": seq_lens,
        "batch": batch,
        "layers": int(text.num_hidden_layers),
        "shapes": [],
        "backward": "warmed" if args.get("backward", True) else "not asked",
        "cache_dir": cache,
        "autotune_files_before": len(before),
    }
    t_all = time.perf_counter()
    devices = _devices(torch, args)
    if not devices:
        raise RuntimeError("torch sees no CUDA device: torch.cuda.device_count() is 0")
    out["devices"] = devices
    for dev in devices:
        with _on(torch, dev):
            _warm_device(torch, transformers, cfg, dev, out, before, cache, vocab)
    new = _autotune_files(cache) - before
    out["autotune_files_new"] = len(new)
    out["tuned_kernels"] = sorted({n.split("/", 1)[1].removesuffix(".autotune.json") for n in new})
    out["fla_in_use"] = "fla.ops.gated_delta_rule" in sys.modules
    out["seconds"] = round(time.perf_counter() - t_all, 2)
    return out


def _warm_device(
    torch: Any,
    transformers: Any,
    cfg: Any,
    dev: str,
    out: dict[str, Any],
    before: set[str],
    cache: str,
    vocab: int,
) -> None:
    """On one device: build the model, then at each shape a forward, and a training forward + backward."""
    seq_lens, batch = out["seq_lens"], out["batch"]
    t0 = time.perf_counter()
    model = _build(torch, transformers, cfg, dev)
    _sync(torch, dev)
    progress(f"warm: {out['layers']}-layer model built on {dev} in {time.perf_counter() - t0:.1f} s")
    for seq_len in seq_lens:
        rec: dict[str, Any] = {"device": dev, "seq_len": seq_len, "batch": batch}
        ids = _ids(torch, dev, vocab, batch, seq_len)
        model.eval()
        t1 = time.perf_counter()
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
        _sync(torch, dev)
        rec["forward_s"] = round(time.perf_counter() - t1, 2)
        progress(
            f"warm: {dev} seq_len {seq_len} x batch {batch}: forward {rec['forward_s']} s "
            f"({len(_autotune_files(cache) - before)} kernel configs tuned so far)"
        )
        if out["backward"] == "warmed":
            model.train()
            t2 = time.perf_counter()
            try:
                _train_step(model, ids)
                _sync(torch, dev)
                rec["train_step_s"] = round(time.perf_counter() - t2, 2)
            except Exception as exc:  # the doctor classifies it (FLA #640 refusal, OOM, ...)
                out["backward"] = "failed"
                out["backward_error"] = error_text(exc)
                out["backward_traceback"] = traceback.format_exc()[-3000:]
                rec["train_step"] = "failed"
            finally:
                model.zero_grad(set_to_none=True)
                model.eval()
            took = (
                f"{rec['train_step_s']} s"
                if "train_step_s" in rec
                else "FAILED: " + out["backward_error"][:160]
            )
            progress(
                f"warm: {dev} seq_len {seq_len} x batch {batch}: forward+backward {took} "
                f"({len(_autotune_files(cache) - before)} kernel configs tuned so far)"
            )
        out["shapes"].append(rec)
    del model
    gc.collect()
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()


def _concurrent(
    torch: Any,
    models: list[Any],
    devices: list[str],
    n_threads: int,
    shape: tuple[int, int],
    vocab: int,
    backward: bool,
) -> dict:
    """n_threads at a barrier, then each runs the passes at once: forward, or forward + backward."""
    barrier = threading.Barrier(n_threads)
    errors: list[dict[str, Any]] = []
    backward_errors: list[dict[str, Any]] = []
    lock = threading.Lock()
    batch, seq_len = shape

    def record(into: list[dict[str, Any]], i: int, dev: str, exc: BaseException) -> None:
        with lock:
            where = traceback.format_exc()[-1500:]
            into.append({"thread": i, "gpu": dev, "error": error_text(exc), "where": where})

    def passes(model: Any, ids: Any, dev: str, i: int) -> None:
        if backward:
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
            try:
                loss.backward()
            except Exception as exc:  # the doctor tells a refused backward (FLA #640) from a race
                record(backward_errors, i, dev, exc)
        else:
            with torch.no_grad():
                model(input_ids=ids, use_cache=False)
        _sync(torch, dev)

    def work(i: int) -> None:
        dev = devices[i % len(devices)]
        model = models[i % len(devices)]
        try:
            ids = _ids(torch, dev, vocab, batch, seq_len, seed=i)
        except Exception as exc:
            record(errors, i, dev, exc)
            barrier.abort()  # the others must not wait for this thread forever
            return
        try:
            barrier.wait()
            with _on(torch, dev):
                passes(model, ids, dev, i)
        except Exception as exc:
            record(errors, i, dev, exc)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=work, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for m in models:
        m.zero_grad(set_to_none=True)
    return {
        "seq_len": seq_len,
        "batch": batch,
        "errors": errors,
        "backward_errors": backward_errors,
        "seconds": round(time.perf_counter() - t0, 2),
    }


def _rounds(torch: Any, models: list[Any], devices: list[str], args: dict[str, Any], vocab: int) -> dict:
    shapes = [(int(args.get("batch", 1)), int(s)) for s in args.get("seq_lens", [256])]
    n_threads = int(args.get("threads", 4))
    backward = bool(args.get("backward", True))
    rounds = [_concurrent(torch, models, devices, n_threads, shape, vocab, backward) for shape in shapes]
    return {
        "errors": [e for r in rounds for e in r["errors"]],
        "backward_errors": [e for r in rounds for e in r["backward_errors"]],
        "seconds": round(sum(r["seconds"] for r in rounds), 2),
        "rounds": rounds,
    }


def check_stress(args: dict[str, Any]) -> dict[str, Any]:
    import torch

    transformers, cfg = _config(args)
    vocab = int(_text_cfg(cfg).vocab_size)
    n_threads = int(args.get("threads", 4))
    devices = _devices(torch, args, limit=n_threads)
    if not devices:
        raise RuntimeError("torch sees no CUDA device: torch.cuda.device_count() is 0")
    backward = bool(args.get("backward", True))
    models = []
    for dev in devices:
        with _on(torch, dev):
            model = _build(torch, transformers, cfg, dev)
        models.append(model.train() if backward else model.eval())
    cold = _rounds(torch, models, devices, args, vocab)
    out: dict[str, Any] = {
        "threads": n_threads,
        "gpus": len(devices),
        "seq_lens": [int(s) for s in args.get("seq_lens", [256])],
        "batch": int(args.get("batch", 1)),
        "backward": backward,
        "layers": int(_text_cfg(cfg).num_hidden_layers),
        "cold": cold,
    }
    if cold["errors"] or cold["backward_errors"]:
        # The mitigation the fix names: the same passes once on ONE thread per GPU, then the threads again.
        for dev, model in zip(devices, models, strict=True):
            for seq_len in out["seq_lens"]:
                ids = _ids(torch, dev, vocab, out["batch"], seq_len)
                try:
                    with _on(torch, dev):
                        if backward:
                            _train_step(model, ids)
                        else:
                            with torch.no_grad():
                                model(input_ids=ids, use_cache=False)
                except Exception as exc:  # a refused backward stays refused; the rounds report it
                    out.setdefault("warmup_errors", []).append(error_text(exc))
                finally:
                    model.zero_grad(set_to_none=True)
        out["after_warmup"] = _rounds(torch, models, devices, args, vocab)
    if cold["errors"]:
        out["ok"] = False
        out["error"] = cold["errors"][0]["error"]
    return out


def check(args: dict[str, Any]) -> dict[str, Any]:
    mode = args.get("mode", "config")
    if mode == "config":
        return check_config(args)
    if mode == "forward":
        return check_forward(args)
    if mode == "warm":
        return check_warm(args)
    return check_stress(args)


if __name__ == "__main__":
    main(check)
