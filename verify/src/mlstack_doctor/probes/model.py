"""Model stage: the config (parsed, known to transformers), the forward on the GPU; the stress tier."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from mlstack_doctor import runner, safetensors_header
from mlstack_doctor.cache import config_stamp, warm
from mlstack_doctor.context import Context
from mlstack_doctor.diagnosis import classify, fix_for
from mlstack_doctor.peaks import bf16_peak
from mlstack_doctor.probes import gpu, packages
from mlstack_doctor.probes import warm as warm_probe
from mlstack_doctor.probes.gpu import _fail
from mlstack_doctor.probes.packages import installed
from mlstack_doctor.record import Result, Stage, failed, passed, warned

CONFIGS = Path(__file__).resolve().parent.parent / "configs"
BUILTIN = {"tiny": "qwen3_5_tiny.json", "27b": "qwen3_5_27b.json"}
REQUIRED = ("hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads")
WEIGHT_GLOBS = ("*.safetensors", "*.bin")


def resolve(spec: str) -> dict[str, Any]:
    """--model tiny|27b|PATH -> {'config', 'weights_dir' (or None)} or {'problem': (code, text)}."""
    if spec in BUILTIN:
        return {"config": str(CONFIGS / BUILTIN[spec]), "weights_dir": None, "builtin": spec}
    path = Path(spec)
    if not path.exists():
        return {"problem": ("MODEL_PATH_MISSING", f"{spec} does not exist")}
    if path.is_dir():
        cfg = path / "config.json"
        if not cfg.is_file():
            return {"problem": ("MODEL_PATH_MISSING", f"{spec} has no config.json")}
        weights = sorted(str(p.name) for g in WEIGHT_GLOBS for p in path.glob(g))
        return {"config": str(cfg), "weights_dir": str(path) if weights else None, "weight_files": weights}
    return {"config": str(path), "weights_dir": None}


def check_safetensors(path: Path) -> str | None:
    """Why a .safetensors file is damaged, from its header alone (no torch): None when whole."""
    return safetensors_header.damage(path)


NO_REPO = "<repo>: the model's Hugging Face repo id; neither config.json nor README.md names it"
SHOWN = 3  # tensors a summary names per kind; evidence.weights_check holds more and the counts


def _bounded(items: list[str], shown: int = 10) -> dict[str, Any]:
    return {"count": len(items), "first": items[:shown]}


def _shape(shape: list[int]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def weights_differ(check: dict[str, Any]) -> str:
    """What a worker's checkpoint comparison found, for a person: '' when the weights fit the config."""
    if not check.get("compared"):
        return ""
    parts = []

    def more(count: int, shown: int) -> str:
        return f" and {count - shown} more" if count > shown else ""

    if n := check.get("mismatched_count", 0):
        rows = check["mismatched"][:SHOWN]
        named = "; ".join(
            f"{m['tensor']} is {_shape(m['checkpoint'])} in {m['file']}, "
            f"the config builds {_shape(m['model'])}"
            for m in rows
        )
        parts.append(f"{n} shape(s) differ: {named}{more(n, len(rows))}")
    if n := check.get("missing_count", 0):
        rows = check["missing"][:SHOWN]
        parts.append(f"{n} tensor(s) the model needs are in no shard: {', '.join(rows)}{more(n, len(rows))}")
    if n := check.get("unexpected_count", 0):
        rows = check["unexpected"][:SHOWN]
        parts.append(f"{n} tensor(s) the model does not have: {', '.join(rows)}{more(n, len(rows))}")
    if n := check.get("dtype_mismatched_count", 0):
        rows = check["dtype_mismatched"][:SHOWN]
        named = "; ".join(f"{m['tensor']} is {m['checkpoint']}, the model holds {m['model']}" for m in rows)
        parts.append(f"{n} integer tensor(s) where the model holds floats: {named}{more(n, len(rows))}")
    return "; ".join(parts)


# A row of transformers' LOAD REPORT table: `key | STATUS | detail` (MISSING, UNEXPECTED, MISMATCH, ...).
_REPORT_ROW = re.compile(r"^(\S+)\s*\|\s*([A-Z_]+)\s*\|\s*(.*\S)\s*$")


def load_report(stderr: str, shown: int = 20) -> dict[str, Any] | None:
    """transformers' load report in a worker's stderr: {count, rows: [{tensor, status, detail}]}."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", stderr or "")
    start = text.rfind("LOAD REPORT")
    if start < 0:
        return None
    rows = [
        {"tensor": m.group(1), "status": m.group(2), "detail": m.group(3)}
        for line in text[start:].splitlines()
        if (m := _REPORT_ROW.match(line.strip())) and m.group(1) != "Key"
    ]
    return {"count": len(rows), "rows": rows[:shown]} if rows else None


def _repo_id(model_dir: str, raw: dict[str, Any]) -> str | None:
    """The Hugging Face repo the folder came from, when config.json or README.md names it."""
    name = raw.get("_name_or_path")
    if isinstance(name, str) and re.fullmatch(r"[\w.-]+/[\w.-]+", name):
        return name
    try:
        readme = (Path(model_dir) / "README.md").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    m = re.search(
        r"(?:huggingface-cli download|hf download|from_pretrained\(\s*[\"'])\s*([\w.-]+/[\w.-]+)", readme
    )
    return m.group(1) if m else None


def _weights_result(
    ckpt: safetensors_header.Checkpoint, weights_dir: str, raw: dict[str, Any], ev: dict[str, Any]
) -> Result | None:
    """MODEL_WEIGHTS_INCOMPLETE (shards the index names are absent) or MODEL_WEIGHTS_CORRUPT (truncated)."""
    name, stage = "model_config", Stage.MODEL
    lost = [*ckpt.missing_shards]
    if ckpt.index_unreadable:
        lost.append(f"{safetensors_header.INDEX} (unreadable)")
    damaged = dict(ckpt.damaged)
    # a file the index does not name is not loaded, yet a damaged one there is still worth naming
    read = {t["file"] for t in ckpt.tensors.values()} | set(damaged)
    for p in sorted(Path(weights_dir).glob("*.safetensors")):
        if p.name not in read and (why := check_safetensors(p)):
            damaged[p.name] = why
    if not lost and not damaged:
        return None
    repo = _repo_id(weights_dir, raw)
    ev["repo"] = repo
    files = " ".join([*lost, *damaged])
    fill = {"repo": repo or "<repo>", "files": files, "model_dir": weights_dir}
    if lost:
        ev["missing_shards"] = lost
        if damaged:
            ev["damaged_shards"] = damaged
        code = "MODEL_WEIGHTS_INCOMPLETE"
        summary = f"weights incomplete: {len(lost)} shard(s) the index names are missing: {', '.join(lost)}"
    else:
        ev["damaged_shards"] = damaged
        code = "MODEL_WEIGHTS_CORRUPT"
        summary = "damaged weights: " + "; ".join(f"{f}: {why}" for f, why in damaged.items())
    fix = fix_for(code, **fill)
    if repo is None:
        fix += f"  ({NO_REPO})"
    return failed(name, stage, summary, code, fix, **ev)


def model_config(ctx: Context) -> Result:
    name, stage = "model_config", Stage.MODEL
    spec = ctx.opts.model or "tiny"
    where = resolve(spec)
    ev: dict[str, Any] = {"model": spec, **{k: v for k, v in where.items() if k != "problem"}}
    if "problem" in where:
        code, text = where["problem"]
        return failed(name, stage, text, code, fix_for(code), **ev)
    cfg_path = where["config"]

    def corrupt(summary: str) -> Result:
        fix = fix_for("MODEL_CONFIG_CORRUPT", model_dir=str(Path(cfg_path).parent))
        return failed(name, stage, summary, "MODEL_CONFIG_CORRUPT", fix, **ev)

    try:
        raw = json.loads(Path(cfg_path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        ev["error"] = f"{type(exc).__name__}: {exc}"
        return corrupt(f"{cfg_path}: {exc}")
    text_cfg = raw.get("text_config", raw) if isinstance(raw, dict) else None
    absent = ["model_type"] if not isinstance(raw, dict) or "model_type" not in raw else []
    absent += [k for k in REQUIRED if not isinstance(text_cfg, dict) or k not in text_cfg]
    if absent:
        ev["missing_fields"] = absent
        return corrupt(f"{cfg_path} lacks {', '.join(absent)}")
    ckpt = None
    if where.get("weights_dir"):
        ckpt = safetensors_header.read_checkpoint(Path(where["weights_dir"]))
        bad = _weights_result(ckpt, where["weights_dir"], raw, ev)
        if bad is not None:
            return bad
        if ckpt.not_in_shard:
            ev["index_names_absent"] = _bounded(sorted(ckpt.not_in_shard))
    ctx.facts["model"] = where
    if ckpt is not None and ckpt.tensors:
        # Weights to compare: the build is not skipped (a warm or a stamp proves the config, not these files).
        return _build_config(ctx, raw, cfg_path, ev, ckpt)
    # A rerun of the warm tier on a warm key: the warm of that key built this config and trained it with the
    # same packages (they are in the key), so building it again proves nothing new and costs the imports.
    warm_key = warm_probe.warm_here(ctx)
    if warm_key is not None:
        key, stamp = warm_key
        summary = (
            f"{raw['model_type']} config parsed; built at the warm of key {key} "
            f"(warmed {stamp.get('finished')}, same packages): not built again"
        )
        return passed(name, stage, summary, warm_key=key, **ev)
    # The warm tier builds the config where it warms: a run that only plans, installs the cluster's warm of
    # the key or has no GPU would pay a worker's imports (seconds of CPU, 13 s on an H200 for the 27B) to
    # decide nothing. The warm of the key builds and trains it; an installed key is proven by the cache's own
    # checks (key, sha256, members, loadable).
    left = warm_probe.build_left_to_warm(ctx)
    if left is not None:
        return passed(name, stage, f"{raw['model_type']} config parsed; {left}", **ev)
    return _build_config(ctx, raw, cfg_path, ev, None)


def _build_config(
    ctx: Context,
    raw: dict[str, Any],
    cfg_path: str,
    ev: dict[str, Any],
    ckpt: safetensors_header.Checkpoint | None,
) -> Result:
    """transformers builds the config on 'meta' (a stamp of an earlier build may stand in, when no
    checkpoint is to be compared); with `ckpt`, every tensor of it is compared with that model."""
    name, stage = "model_config", Stage.MODEL
    if installed("transformers") is None:
        unchecked = "model type unchecked" + (", weights not compared with it" if ckpt else "")
        return warned(
            name,
            stage,
            f"{raw['model_type']} config parsed; transformers not installed, {unchecked}",
            None,
            None,
            **ev,
        )
    # In the GPU session when it is already running (its imports are paid once), else in its own worker.
    # Not in a session whose imports failed: importing torch again after a failed `import torch` re-runs
    # torch/__init__.py over live C++ state and raises nonsense (e.g. "module functions cannot set
    # METH_CLASS or METH_STATIC"); a fresh process raises the first, real error.
    s = ctx.session
    import_errors = (s.imports.get("import_errors") or {}) if s is not None and s.started else {}
    # A worker of its own (no session running its imports): a build with these very files may be stamped.
    own_worker = s is None or s.dead or not s.started
    stamp_key = config_stamp.key(cfg_path) if own_worker and ckpt is None else None
    stamp = config_stamp.read(warm_probe.cache_dir(), stamp_key) if stamp_key else None
    if stamp is not None:
        uncompiled = config_stamp.uncompiled()
        if not uncompiled:
            return _built(ctx, name, stage, ev, stamp["data"], _stamp_evidence(stamp_key, stamp))
        ev["config_stamp_unused"] = (
            f"{', '.join(uncompiled)} not compiled in this venv yet: built, which compiles the bytecode"
        )
    with tempfile.TemporaryDirectory(prefix="mlstack-doctor-ckpt-") as tmp:
        args = {"config": cfg_path}
        if ckpt is not None:  # a file, not an argument: a 27B checkpoint's table is larger than argv allows
            table = Path(tmp) / "checkpoint.json"
            table.write_text(json.dumps(ckpt.tensors), encoding="utf-8")
            os.chmod(tmp, 0o755)  # the session's worker may run as another uid
            args["checkpoint"] = str(table)
        script, extra = gpu.OPS["model_config"]
        if import_errors:
            ev["session_import_errors"] = import_errors
            res = runner.run_worker(script, {**args, **extra}, timeout=ctx.timeout(300))
        else:
            res = gpu.call(ctx, name, "model_config", args, timeout=ctx.timeout(300), only_if_started=True)
        if not res.ok:  # in the folder's lifetime: the experiment reruns the worker with these args
            return _config_failed(ctx, raw, cfg_path, res, (script, {**args, **extra}), ev)
    data = {k: v for k, v in res.data.items() if k not in ("ok", "error", "traceback", "id")}
    check = data.pop("weights_check", None)
    if check is not None:
        ev["weights_check"] = check
        if differs := weights_differ(check):
            ev.update(data)
            model_dir = str(Path(cfg_path).parent)
            repo = _repo_id(model_dir, raw)
            fix = fix_for("MODEL_WEIGHTS_MISMATCH", repo=repo or "<repo>", model_dir=model_dir)
            if repo is None:
                fix += f"  ({NO_REPO})"
            return failed(
                name, stage, f"weights do not fit config.json: {differs}", "MODEL_WEIGHTS_MISMATCH", fix, **ev
            )
    stamped: dict[str, Any] = {}
    if stamp_key:
        try:
            stamped["config_stamp"] = str(config_stamp.write(warm_probe.cache_dir(), stamp_key, data))
        except OSError as exc:
            stamped["config_stamp_unwritten"] = f"{type(exc).__name__}: {exc}"
    return _built(ctx, name, stage, ev, data, stamped)


def _config_failed(
    ctx: Context,
    raw: dict[str, Any],
    cfg_path: str,
    res: runner.WorkerResult,
    rerun: tuple[str, dict[str, Any]],
    ev: dict[str, Any],
) -> Result:
    """The config's build failed. The JSON parsed with every field, so what the evidence names first: a
    package this user cannot read, transformers not knowing the type; else the way every probe that runs
    stack code goes (gpu._fail: the rules over its text, then the experiment rerunning this worker)."""
    name, stage = "model_config", Stage.MODEL
    data = {k: v for k, v in res.data.items() if k not in ("ok", "error", "traceback", "id")}
    ev.update(data)
    unreadable = packages.unreadable_file(res.error_text + (res.data.get("traceback") or "")) or " ".join(
        packages.unreadable_dirs({})
    )
    if unreadable:
        ev.update(res.evidence(), unreadable=unreadable)
        code = "PACKAGE_UNREADABLE"
        fix = fix_for(code, path=unreadable)
        return failed(
            name, stage, f"cannot import the stack: {res.error_text.strip()[:300]}", code, fix, **ev
        )
    if res.answered and not res.run.timed_out and "model_type" in res.error_text:
        ev.update(res.evidence())
        code = "MODEL_TYPE_UNKNOWN"
        fix = fix_for(code, python=ctx.python, model_dir=str(Path(cfg_path).parent))
        what = f"transformers rejects {raw['model_type']}: {res.error_text.strip()[-300:]}"
        return failed(name, stage, what, code, fix, **ev)
    fix_args = {"model_dir": str(Path(cfg_path).parent)}
    what = f"transformers cannot build {raw['model_type']}"
    return _fail(name, stage, ctx, res, "MODEL_LOAD_FAILED", what, fix_args, rerun=rerun, **ev)


def _stamp_evidence(key: str, stamp: dict[str, Any]) -> dict[str, Any]:
    return {
        "config_stamp": str(config_stamp.stamp_path(warm_probe.cache_dir(), key)),
        "built_at": stamp.get("built"),
        "built_on": stamp.get("host"),
    }


def _built(
    ctx: Context, name: str, stage: Stage, ev: dict[str, Any], data: dict[str, Any], more: dict[str, Any]
) -> Result:
    """A config transformers built: now by a worker, or earlier with these very files (`more` says)."""
    ev.update(data)
    ev.update(more)
    ctx.facts["model_info"] = data
    params = f", {data['params'] / 1e9:.2f} B params" if data.get("params") else ""
    summary = f"transformers {data['transformers']} builds {data['config_class']}{params}"
    check = ev.get("weights_check")
    if check and check.get("compared"):
        summary += f"; the checkpoint's {check['checkpoint_tensors']} tensors fit it (names, shapes)"
    elif check:
        summary += f"; weights not compared: {check.get('why')}"
    if "built_at" in more:
        summary += (
            f" (built at {more['built_at']} on {more['built_on']} with these very files: not built again)"
        )
    return passed(name, stage, summary, **ev)


def model_forward(ctx: Context) -> Result:
    name, stage = "model_forward", Stage.MODEL
    where = ctx.facts["model"]
    args = {
        "config": where["config"],
        "weights_dir": where.get("weights_dir"),
        "tokens": ctx.opts.tokens,
        "measure_peak": ctx.opts.measure_peak,
    }
    res = gpu.call(ctx, name, "model_forward", args, timeout=ctx.timeout(600))
    data = {k: v for k, v in res.data.items() if k not in ("ok", "error", "traceback", "id")}
    if res.answered and res.data.get("refused"):
        return failed(
            name,
            stage,
            f"needs ~{data['need_gib']} GiB, GPU has {data['gpu_free_gib']} GiB free "
            f"({data['params'] / 1e9:.1f} B params in bf16)",
            "GPU_MEMORY_TOO_SMALL",
            fix_for("GPU_MEMORY_TOO_SMALL"),
            **data,
        )
    if not res.ok:
        default = "MODEL_LOAD_FAILED"
        if data.get("logits_shape") and data.get("logits_shape") != data.get("expected_logits_shape"):
            default = "LOGITS_SHAPE_WRONG"
        elif data.get("logits_finite") is False:
            default = "NONFINITE_LOGITS"
        # The folder the weights came from (the vetting reads it), and transformers' own load report: its
        # table names each tensor that did not load and both shapes, while its exception says "see above".
        if where.get("weights_dir"):
            data["weights_dir"] = where["weights_dir"]
            if report := load_report(res.run.stderr):
                data["load_report"] = report
        # A failure transformers' report does not name is rerun (the experiment) with the same worker.
        script, extra = gpu.OPS["model_forward"]
        rerun = None if data.get("load_report") else (script, {**args, **extra})
        return _fail(name, stage, ctx, res, default, "model forward failed", rerun=rerun, **data)
    peak = bf16_peak(str(data.get("gpu", "")))
    data["bf16_peak_tflops_datasheet"] = peak
    if peak:
        data["mfu_vs_datasheet"] = round(data["achieved_tflops"] / peak, 3)
    if data.get("matmul_peak_tflops"):
        data["mfu_vs_measured_matmul"] = round(data["achieved_tflops"] / data["matmul_peak_tflops"], 3)
    mfu = f", MFU {data['mfu_vs_datasheet']:.0%} of {peak:.0f} TFLOP/s" if peak else ""
    return passed(
        name,
        stage,
        f"{data['weights']} {data['params'] / 1e9:.2f} B: load {data['load_s']} s, "
        f"first forward {data['first_forward_s']} s, "
        f"{data['tokens']} tok in {data['steady_forward_s'] * 1000:.0f} ms "
        f"= {data['tokens_per_s']:.0f} tok/s{mfu}",
        **data,
    )


def autotune_stress(ctx: Context) -> Result:
    """N threads over the GPUs run the training passes at the same moment (triton-lang/triton#11494).

    Always a fresh process: the in-memory autotuner caches of the session would hide the race. On the
    shared cache (default) it proves what training will meet: a warmed cache passes, a cold one races.
    """
    name, stage = "autotune_stress", Stage.STRESS
    cfg, parts, full_layers = warm_probe.setup(ctx)
    shared = ctx.opts.stress_cache == "shared"
    cache = warm_probe.cache_dir() if shared else tempfile.mkdtemp(prefix="mlstack-doctor-stress-")
    decision = warm.decide(cache, parts)
    state = "warmed" if not decision.warm else "cold"
    cache_ev = {
        "mode": ctx.opts.stress_cache,
        "dir": cache,
        "state": state,
        "warm_key": decision.key,
        "warm_reason": decision.reason,
        "entries_before": len(warm.entries(cache)),
    }
    args = {
        "mode": "stress",
        "config_dict": cfg,
        "threads": ctx.opts.threads,
        "seq_lens": parts["shapes"]["seq_lens"],
        "batch": parts["shapes"]["batch"],
        "backward": True,
    }
    try:
        res = runner.run_worker(
            "w_model.py", args, timeout=ctx.timeout(900), env=None if shared else {"TRITON_CACHE_DIR": cache}
        )
    finally:
        if not shared:
            shutil.rmtree(cache, ignore_errors=True)
    data = {k: v for k, v in res.data.items() if k not in ("ok", "error", "traceback")}
    data["cache"] = cache_ev
    data["layers_full"] = full_layers

    def split(rounds: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """(errors, refused): a backward FLA refuses (FLA #640) is not a race."""
        errors, refused = list(rounds.get("errors", [])), []
        for e in rounds.get("backward_errors", []):
            is_refusal = classify(e["error"], "STRESS_FAILED") == "FLA_BACKWARD_NEEDS_TILELANG"
            (refused if is_refusal else errors).append(e)
        return errors, refused

    errors, refused = split(data.get("cold") or {})
    shape = f"seq_len {','.join(map(str, parts['shapes']['seq_lens']))} x batch {parts['shapes']['batch']}"
    if res.answered and errors:
        codes = sorted({classify(e["error"], "STRESS_FAILED") for e in errors})
        after = data.get("after_warmup", {})
        mitigated = bool(after) and not split(after)[0]
        if "AUTOTUNER_RACE" in codes:
            code = "AUTOTUNER_RACE"
        elif codes == ["STRESS_FAILED"] and mitigated:
            code = "CONCURRENT_INIT_RACE"  # fails only when cold and concurrent: a first-call race
        else:
            code = codes[0]
        data["codes"] = codes
        data["warm_cache_mitigation"] = "works" if mitigated else "did not help"
        threads = {e["thread"] for e in errors}
        fix = fix_for(
            code,
            model=ctx.opts.model or "tiny",
            seq_len=",".join(map(str, parts["shapes"]["seq_lens"])),
            batch=parts["shapes"]["batch"],
        )
        return failed(
            name,
            stage,
            f"{len(threads)} of {data['threads']} threads failed on a {state} cache ({shape}; "
            f"{errors[0]['error'][:120]}); after one single-thread warm-up pass: "
            f"{data['warm_cache_mitigation']}",
            code,
            fix,
            **data,
        )
    if not res.ok:
        return _fail(name, stage, ctx, res, "STRESS_FAILED", "stress run failed", **data)
    cold = data.get("cold") or {}
    done = (
        f"{data['threads']} threads on {data['gpus']} GPU(s) at once, {shape}, "
        f"{data['layers']} of {full_layers} layers, {state} cache: no race ({cold.get('seconds')} s)"
    )
    if refused:
        return gpu.backward_refused(
            ctx, name, stage, f"forward: {done}; backward refused by FLA (FLA #640), not stressed", **data
        )
    return passed(name, stage, f"forward+backward: {done}", **data)
