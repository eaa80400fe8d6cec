"""The warm step's cache key and its stamp in the Triton cache (standard library only).

The warm step runs, in ONE thread, the forward and backward passes training will run, so that every
autotuned Triton/FLA kernel has its tuned config and binary on disk before several threads (or GPUs)
reach it at once (the autotuner race, triton-lang/triton#11494). It is worth doing once per key:

  gpu       the GPUs' names and compute capabilities (Triton compiles per arch; tuned timings per GPU)
  packages  torch, triton, flash-linear-attention, fla-core, transformers, tilelang, causal-conv1d
  config    a hash of the depth-reduced config that is warmed (autotune keys depend on layer widths,
            not on depth: 4 layers at the 27B widths cover all 64)
  shapes    the training sequence lengths and batch size (autotune keys include shapes)
  dtype, passes, recipe   bf16; forward + backward; the version of this procedure

After a warm run the doctor writes a stamp, <cache>/mlstack-warm/<key>.json, naming the cache entries
the run created. The next run skips when the stamp of its key exists and those entries are still there;
otherwise it says which part of the key changed, or what is missing, and warms again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mlstack_doctor.files import read_json_object, write_atomic

RECIPE = 1  # bump when what the warm step runs changes: every stamp is then stale
STAMP_DIR = "mlstack-warm"
KEY_PACKAGES = (
    "torch",
    "triton",
    "flash-linear-attention",
    "fla-core",
    "transformers",
    "tilelang",
    "causal-conv1d",
)


def warm_config(raw: dict[str, Any], layers: int | None = None) -> dict[str, Any]:
    """A copy of the model config with fewer layers and the same widths.

    Default depth: up to and including the first layer of every layer type (Qwen3.5: 3 linear + 1 full
    attention = 4), which calls every kernel the full model calls. `layers` overrides it (0: full depth).
    A multimodal config's text_config is what is warmed.
    """
    text = dict(raw.get("text_config", raw)) if isinstance(raw.get("text_config"), dict) else dict(raw)
    if "model_type" not in text and "model_type" in raw:
        text["model_type"] = raw["model_type"]
    full = int(text.get("num_hidden_layers", 0) or 0)
    types = list(text.get("layer_types") or [])
    if layers == 0 or full == 0:
        return text
    if layers is None:
        if types:
            seen: set[str] = set()
            layers = 0
            for i, t in enumerate(types):
                if t not in seen:
                    seen.add(t)
                    layers = i + 1
        else:
            layers = 1
    layers = max(1, min(layers, full))
    text["num_hidden_layers"] = layers
    if types:
        text["layer_types"] = types[:layers]
    return text


def config_hash(cfg: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]


def gpu_part(nvml_gpus: list[dict[str, Any]] | None, visible: str | None) -> list[str]:
    """The visible GPUs as 'name sm_XY', sorted, unique: what Triton's cache and the timings depend on."""
    gpus = list(nvml_gpus or [])
    if visible is not None:
        items = [x.strip() for x in visible.split(",") if x.strip()]
        if items and all(x.isdigit() for x in items):
            wanted = {int(x) for x in items}
            gpus = [g for g in gpus if g.get("index") in wanted]
    out = set()
    for g in gpus:
        cc = g.get("compute_capability")
        out.add(f"{g.get('name', '?')} sm_{str(cc).replace('.', '')}" if cc else str(g.get("name", "?")))
    return sorted(out)


def key_parts(
    *,
    gpus: list[str],
    packages: dict[str, str | None],
    cfg: dict[str, Any],
    seq_lens: list[int],
    batch: int,
    dtype: str = "bfloat16",
    passes: str = "forward+backward",
) -> dict[str, Any]:
    return {
        "gpu": list(gpus),
        "packages": {p: packages.get(p) for p in KEY_PACKAGES},
        "config": config_hash(cfg),
        "config_summary": {
            k: cfg.get(k)
            for k in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "vocab_size")
        },
        "shapes": {"seq_lens": sorted(set(int(s) for s in seq_lens)), "batch": int(batch)},
        "dtype": dtype,
        "passes": passes,
        "recipe": RECIPE,
    }


def cache_key(parts: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


def stamp_path(cache_dir: str | Path, key: str) -> Path:
    return Path(cache_dir) / STAMP_DIR / f"{key}.json"


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict):
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        name = f"{prefix}.{k}" if prefix else str(k)
        if isinstance(v, dict):
            out.update(_flat(v, name))
        else:
            out[name] = v
    return out


def diff(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two key parts, as 'part: old -> new'."""
    a, b = _flat(old), _flat(new)
    return [f"{k}: {a.get(k)} -> {b.get(k)}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


@dataclass
class Decision:
    warm: bool  # True: run the warm step
    reason: str
    key: str
    stamp: dict[str, Any] | None = None


def decide(cache_dir: str | Path, parts: dict[str, Any], *, force: bool = False) -> Decision:
    """Warm or skip, and why."""
    key = cache_key(parts)
    if force:
        return Decision(True, "--rewarm: warming again whatever the stamp says", key)
    path = stamp_path(cache_dir, key)
    stamp = read_json_object(path) if path.is_file() else None
    if path.is_file() and stamp is None:
        return Decision(True, f"the stamp {path} is unreadable: warming again", key)
    if stamp is not None:
        entries = [str(e) for e in stamp.get("entries", [])]
        gone = [e for e in entries if not (Path(cache_dir) / e).is_dir()]
        if gone:
            return Decision(
                True,
                f"{len(gone)} of {len(entries)} cache entries the warm step wrote are gone: warming again",
                key,
                stamp,
            )
        return Decision(False, "cache key already warm", key, stamp)
    stamps = (read_json_object(p) for p in (Path(cache_dir) / STAMP_DIR).glob("*.json"))
    others = sorted(
        (s for s in stamps if s and "parts" in s),
        key=lambda s: str(s.get("finished", "")),
    )
    if not others:
        return Decision(True, "no warm stamp in this cache (cold)", key)
    changed = diff(others[-1]["parts"], parts)
    return Decision(True, "cache key changed since the last warm step: " + "; ".join(changed), key)


def entries(cache_dir: str | Path) -> set[str]:
    """The cache's entries (Triton writes one folder per kernel hash / autotune key); the doctor's own
    folders (mlstack-warm, mlstack-share, mlstack-quarantine, ...) are not entries."""
    try:
        with os.scandir(cache_dir) as it:
            return {
                e.name for e in it if e.is_dir(follow_symlinks=False) and not e.name.startswith("mlstack-")
            }
    except OSError:
        return set()


def write_stamp(cache_dir: str | Path, parts: dict[str, Any], record: dict[str, Any]) -> Path:
    """Write <cache>/mlstack-warm/<key>.json atomically (several containers may share the cache)."""
    key = cache_key(parts)
    doc = {"key": key, "parts": parts, "finished": datetime.now(UTC).isoformat(timespec="seconds"), **record}
    return write_atomic(stamp_path(cache_dir, key), json.dumps(doc, indent=2, sort_keys=True))
