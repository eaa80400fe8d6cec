"""The warm step (tier `warm`): every autotuned kernel training will call, tuned once, in ONE thread.

Several threads (or GPUs) autotuning the same Triton kernel on a cold cache crash in Triton's
autotuner (`'NoneType' object is not a mapping`, triton-lang/triton#11494). Tuned configs persist on
disk (FLA passes cache_results=True), so one single-thread pass over the training shapes makes the
first real training step race-free. The warm step runs a depth-reduced copy of the model config (same
widths, one layer of each type: autotune keys depend on widths, not on depth), at the training shapes,
forward and backward, and skips when its cache key (mlstack_doctor.warm) is already warm.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mlstack_doctor import runner, warm
from mlstack_doctor.context import Context
from mlstack_doctor.diagnosis import classify, fix_for
from mlstack_doctor.probes import gpu
from mlstack_doctor.probes.packages import installed
from mlstack_doctor.record import Result, Stage, failed, passed

NAME, STAGE = "triton_warm", Stage.WARM


def cache_dir() -> str:
    return os.environ.get("TRITON_CACHE_DIR") or str(Path.home() / ".triton" / "cache")


def _gpus(ctx: Context) -> list[dict[str, Any]]:
    if ctx.facts.get("nvml_gpus") is None:  # nvidia_driver did not run (--only): ask NVML now
        ctx.facts["nvml_gpus"] = runner.run_worker("w_nvml.py", {}, timeout=ctx.timeout(60)).data.get("gpus")
    return ctx.facts.get("nvml_gpus") or []


def setup(ctx: Context) -> tuple[dict[str, Any], dict[str, Any], int]:
    """The depth-reduced config, the cache-key parts, and the full model's depth."""
    raw = json.loads(Path(ctx.facts["model"]["config"]).read_text(encoding="utf-8"))
    cfg = warm.warm_config(raw, ctx.opts.warm_layers)
    full = warm.warm_config(raw, 0).get("num_hidden_layers")
    parts = warm.key_parts(
        gpus=warm.gpu_part(_gpus(ctx), os.environ.get("CUDA_VISIBLE_DEVICES")),
        packages={p: installed(p) for p in warm.KEY_PACKAGES},
        cfg=cfg,
        seq_lens=ctx.opts.seq_lens,
        batch=ctx.opts.batch_size,
    )
    return cfg, parts, int(full or 0)


def triton_warm(ctx: Context) -> Result:
    cfg, parts, full_layers = setup(ctx)
    cache = cache_dir()
    decision = warm.decide(cache, parts, force=ctx.opts.rewarm)
    shapes = f"seq_len {','.join(map(str, parts['shapes']['seq_lens']))} x batch {parts['shapes']['batch']}"
    depth = f"{cfg.get('num_hidden_layers')} of {full_layers} layers at full width"
    ev: dict[str, Any] = {
        "reason": decision.reason,
        "key": decision.key,
        "key_parts": parts,
        "cache_dir": cache,
        "stamp_path": str(warm.stamp_path(cache, decision.key)),
        "layers_warmed": cfg.get("num_hidden_layers"),
        "layers_full": full_layers,
    }
    if not decision.warm:
        st = decision.stamp or {}
        summary = (
            f"skipped: cache key already warm ({decision.key}, warmed {st.get('finished')}: "
            f"{st.get('kernels_tuned')} kernel configs tuned in {st.get('seconds')} s, "
            f"backward {st.get('backward')})"
        )
        if st.get("backward") == "refused":  # the same verdict as the run that stamped it
            return gpu.backward_refused(ctx, NAME, STAGE, summary, action="skipped", stamp=st, **ev)
        return passed(NAME, STAGE, summary, action="skipped", stamp=st, **ev)
    before = warm.entries(cache)
    args = {
        "config_dict": cfg,
        "seq_lens": parts["shapes"]["seq_lens"],
        "batch": parts["shapes"]["batch"],
        "backward": True,
    }
    res = gpu.call(ctx, NAME, "warm", args, timeout=ctx.timeout(1800))
    data = {k: v for k, v in res.data.items() if k not in ("ok", "error", "traceback", "id")}
    if not res.ok:
        return gpu._fail(
            NAME, STAGE, ctx, res, "WARM_FAILED", "warm step failed", **{**data, **ev}, action="failed"
        )
    new = sorted(warm.entries(cache) - before)
    tuned, kernels = data.get("autotune_files_new", 0), len(data.get("tuned_kernels", []))
    bwd_code = (
        classify(data.get("backward_error", ""), "WARM_FAILED") if data["backward"] == "failed" else None
    )
    if bwd_code and bwd_code != "FLA_BACKWARD_NEEDS_TILELANG":
        return failed(
            NAME,
            STAGE,
            f"forward warmed, then the training step failed: {data.get('backward_error', '')[:240]}",
            bwd_code,
            fix_for(bwd_code, python=ctx.python),
            **{**data, **ev, "action": "failed"},
        )
    record = {
        "seconds": data.get("seconds"),
        "kernels_tuned": tuned,
        "kernels": kernels,
        "new_cache_entries": len(new),
        "entries": new,
        "backward": "refused" if bwd_code else "warmed",
        "shapes": data.get("shapes"),
    }
    try:
        stamp = warm.write_stamp(cache, parts, record)
    except OSError as exc:
        return failed(
            NAME,
            STAGE,
            f"warmed, but the stamp cannot be written: {exc}",
            "TRITON_CACHE_UNWRITABLE",
            fix_for("TRITON_CACHE_UNWRITABLE", cache_dir=cache),
            **{**data, **ev, "action": "failed"},
        )
    ev["stamp_path"] = str(stamp)
    ev["new_cache_entries"] = len(new)
    done = (
        f"{tuned} kernel configs tuned ({kernels} kernels), {len(new)} new cache entries, "
        f"{data.get('seconds')} s; {depth}, {shapes}, one thread"
    )
    if bwd_code:
        return gpu.backward_refused(
            ctx,
            NAME,
            STAGE,
            f"forward warmed ({done}); backward REFUSED by FLA (FLA #640): training's backward kernels "
            "are NOT warm",
            **{**data, **ev, "action": "warmed"},
        )
    return passed(NAME, STAGE, f"warmed forward+backward: {done}", **{**data, **ev, "action": "warmed"})
