"""The warm step (tier `warm`): every autotuned kernel training will call, tuned once, in ONE thread.

Several threads (or GPUs) autotuning the same Triton kernel on a cold cache crash in Triton's
autotuner (`'NoneType' object is not a mapping`, triton-lang/triton#11494). Tuned configs persist on
disk (FLA passes cache_results=True), so one single-thread pass over the training shapes makes the
first real training step race-free. The warm step runs a depth-reduced copy of the model config (same
widths, one layer of each type: autotune keys depend on widths, not on depth), at the training shapes,
forward and backward, and skips when its cache key (mlstack_doctor.cache.warm) is already warm.

With --warm-share, the cluster's cache (mlstack_doctor.cache.warm_share): a cold key is installed from the
share's artifact of that key instead of warmed (checked first; refused, it is warmed here as without a
share), and a sound warm (passed, backward warmed) the share lacks is published to it. --warm-plan
decides, and installs what the share holds, but never warms: its caller fetches the artifact of the key
it names first. Under --no-gpu the key's file work still runs; nothing is warmed.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from mlstack_doctor import runner
from mlstack_doctor.cache import warm, warm_share
from mlstack_doctor.context import Context
from mlstack_doctor.diagnosis import classify, fix_for
from mlstack_doctor.probes import caches, gpu
from mlstack_doctor.probes.packages import installed
from mlstack_doctor.record import Result, Stage, Status, failed, passed

NAME, STAGE = "triton_warm", Stage.WARM


def cache_dir() -> str:
    return os.environ.get("TRITON_CACHE_DIR") or str(Path.home() / ".triton" / "cache")


def _gpus(ctx: Context) -> list[dict[str, Any]]:
    if not ctx.opts.expect_gpu:  # --no-gpu with a share (the key's file work): no GPU to ask about
        return []
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


def warm_here(ctx: Context) -> tuple[str, dict[str, Any]] | None:
    """In the warm tier, the key and stamp when this run's key is already warm in this cache (its config was
    built, and run forward and backward, with these very packages); else None. ctx.facts["model"] is set."""
    if ctx.opts.tier != "warm" or ctx.opts.rewarm:
        return None
    decision = warm.decide(cache_dir(), setup(ctx)[1])
    return None if decision.warm else (decision.key, decision.stamp or {})


def build_left_to_warm(ctx: Context) -> str | None:
    """In the warm tier, why this run leaves building the model config to the warm of its key: it only plans,
    has no GPU to warm on, or installs the key from the cluster's cache. None where it may warm (a refused
    install warms too, and its worker builds the config it trains). ctx.facts["model"] is set."""
    if ctx.opts.tier != "warm":
        return None
    if ctx.opts.warm_plan:
        return "a warm plan leaves the build to the warm of its key"
    if not ctx.opts.expect_gpu:
        return "no GPU expected: nothing is warmed here, and the warm of its key builds it"
    cache = cache_dir()
    share = _share(ctx, cache)
    if share is None or ctx.opts.rewarm:
        return None
    key = warm.cache_key(setup(ctx)[1])
    if not warm_share.has(share, key):
        return None
    return f"the cluster's cache holds key {key}: installed here, built where it was warmed"


def _share(ctx: Context, cache: str) -> Path | None:
    """The cluster's cache as this host sees it (--warm-share DIR), the node's own share folder inside the
    cache (--warm-share alone: the controller's copies land there), or None (no sharing)."""
    if ctx.opts.warm_share is None:
        return None
    return Path(ctx.opts.warm_share) if ctx.opts.warm_share else warm_share.node_share(cache)


def _publish(cache: str, key: str, share: Path, ev: dict[str, Any]) -> None:
    """Publish a sound warm of `key` when the share lacks it; say what was done in `ev`."""
    if not warm_share.has(share, key):
        try:
            ev["published"] = str(warm_share.pack(cache, key, share))
        except (warm_share.Refused, OSError) as exc:
            ev["publish_refused"] = str(exc)
    ev["share_has_key"] = warm_share.has(share, key)
    if ev["share_has_key"]:
        ev["share_artifact"] = str(warm_share.artifact_path(share, key))


def _warm_already(ctx: Context, summary: str, st: dict[str, Any], action: str, ev: dict[str, Any]) -> Result:
    if st.get("backward") == "refused":  # the same verdict as the run that stamped it
        return gpu.backward_refused(ctx, NAME, STAGE, summary, action=action, stamp=st, **ev)
    return passed(NAME, STAGE, summary, action=action, stamp=st, **ev)


def _done_before(st: dict[str, Any]) -> str:
    tuned = f"{st.get('kernels_tuned')} kernel configs tuned in {st.get('seconds')} s"
    return f"warmed {st.get('finished')}: {tuned}, backward {st.get('backward')}"


def triton_warm(ctx: Context) -> Result:
    cfg, parts, full_layers = setup(ctx)
    cache = cache_dir()
    decision = warm.decide(cache, parts, force=ctx.opts.rewarm)
    share = _share(ctx, cache)
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
    if share is not None:
        ev["share_dir"] = str(share)
    if not decision.warm:
        st = decision.stamp or {}
        if share is not None and st.get("backward") == "warmed":
            _publish(cache, decision.key, share, ev)
        summary = f"skipped: cache key already warm ({decision.key}, {_done_before(st)})"
        return _warm_already(ctx, summary, st, "skipped", ev)
    if share is not None and not ctx.opts.rewarm:
        if warm_share.has(share, decision.key):
            artifact = warm_share.artifact_path(share, decision.key)
            try:
                st = warm_share.install(
                    share, decision.key, parts, cache, lambda cubins: caches.driver_refusals(ctx, cubins, ev)
                )
            except (warm_share.Refused, OSError) as exc:
                ev["share_refused"] = f"{exc}: warming locally"
            else:
                ev.update(share_has_key=True, share_artifact=str(artifact), installed_from=str(artifact))
                summary = (
                    f"skipped: installed from the cluster's cache {artifact}, key {decision.key} "
                    f"({_done_before(st)})"
                )
                return _warm_already(ctx, summary, st, "installed", ev)
        else:
            ev["share_note"] = warm_share.nearest(share, parts)
        ev["share_has_key"] = False
    if ctx.opts.warm_plan:
        return passed(NAME, STAGE, f"planned: would warm ({decision.reason})", action="planned", **ev)
    if not ctx.opts.expect_gpu:  # --no-gpu with a share: the key was checked, nothing can be warmed
        return Result(NAME, STAGE, Status.SKIP, "no GPU expected (--no-gpu)", ev)
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
    if share is not None:
        _publish(cache, decision.key, share, ev)
    return passed(NAME, STAGE, f"warmed forward+backward: {done}", **{**data, **ev, "action": "warmed"})
