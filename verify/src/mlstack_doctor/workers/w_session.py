"""The doctor's long-lived GPU worker: imports torch, Triton, transformers and FLA ONCE, then runs the
GPU probes one request at a time (one JSON request per stdin line, one result line per request).

Each probe is still its own request, timed and answered on its own; a crash or a hang of this process
is reported by the doctor against the request that was running. Ops: imports, torch_cuda, fla_device,
fla_kernel, gdn_backward, torch_compile, model_config, model_forward, warm, exit.
"""

from __future__ import annotations

import gc
import importlib
import json
import sys
import time
import warnings
from typing import Any

import w_compile
import w_fla
import w_model
import w_torch_cuda
from _common import STATE, emit, error_text, run_one


def imports(args: dict[str, Any]) -> dict[str, Any]:
    """Import the stack once, each module timed; a module that fails is reported, not fatal."""
    seconds: dict[str, float] = {}
    errors: dict[str, str] = {}
    for mod in args.get("modules", ["torch", "triton", "transformers", "fla.utils"]):
        t0 = time.perf_counter()
        try:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                importlib.import_module(mod)
            if mod.startswith("fla"):
                STATE["fla_import_warnings"] = [str(w.message) for w in caught]
        except BaseException as exc:  # ImportError, or whatever the stack raises at import
            errors[mod] = error_text(exc)
        seconds[mod] = round(time.perf_counter() - t0, 2)
    STATE["import_errors"] = errors  # later checks must not retry them (w_model.check_config)
    return {"imports_s": seconds, "import_errors": errors, "total_s": round(sum(seconds.values()), 2)}


OPS = {
    "imports": imports,
    "torch_cuda": w_torch_cuda.check,
    "fla_device": lambda a: w_fla.check({**a, "mode": "device"}),
    "fla_kernel": lambda a: w_fla.check({**a, "mode": "kernel"}),
    "gdn_backward": lambda a: w_fla.check({**a, "mode": "backward"}),
    "torch_compile": w_compile.check,
    "model_config": lambda a: w_model.check({**a, "mode": "config"}),
    "model_forward": lambda a: w_model.check({**a, "mode": "forward"}),
    "warm": lambda a: w_model.check({**a, "mode": "warm"}),
}


def _release() -> None:
    """Free what a probe left on the GPU (the model of model_forward) before the next one."""
    gc.collect()
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
    except Exception as exc:  # a sticky CUDA error: the next request reports it with its own probe
        sys.stderr.write(f"empty_cache failed: {error_text(exc)}\n")


def serve() -> None:
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            req = json.loads(line)
        except json.JSONDecodeError as exc:
            emit({"id": None, "ok": False, "error": f"bad request: {exc}"})
            continue
        op = req.get("op")
        if op == "exit":
            break
        fn = OPS.get(op)
        if fn is None:
            data = {"ok": False, "error": f"unknown op {op!r}"}
        else:
            data = run_one(fn, req.get("args") or {})
        data["id"] = req.get("id")
        emit(data)
        _release()


if __name__ == "__main__":
    serve()
