"""torch.compile (inductor) on the GPU: compile a small function, run it, compare it with eager.

Inductor generates Triton kernels with the Triton that is installed, not the one torch pins: a profile
that overrides torch's triton pin can leave FLA working and torch.compile broken. Inductor's own cache
is a fresh folder and its FX graph cache is off, so a cached graph cannot hide broken code generation.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from typing import Any

from _common import main, progress

TOL = 2e-2  # bf16 inputs, float32 accumulation; eager and inductor fuse differently


def _fn(x: Any, w: Any, b: Any) -> Any:
    """A matmul, a pointwise chain and a reduction: inductor emits a Triton matmul or an aten call plus
    fused Triton pointwise and reduction kernels."""
    import torch

    h = torch.nn.functional.gelu(x @ w + b)
    return torch.nn.functional.layer_norm(h, h.shape[-1:]) * torch.sigmoid(h.sum(-1, keepdim=True))


def check(args: dict[str, Any]) -> dict[str, Any]:
    import torch

    device = args.get("device", "cuda")
    mode = args.get("mode_compile") or "default"
    info: dict[str, Any] = {"torch": torch.__version__, "device": device, "compile_mode": mode}
    try:
        import triton

        info["triton"] = triton.__version__
    except ImportError as exc:  # inductor needs it on the GPU; the compile below says so too
        info["triton"] = f"not importable: {exc}"
    cache = tempfile.mkdtemp(prefix="mlstack-doctor-inductor-")
    old_cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    try:
        import torch._inductor.config as inductor_config

        inductor_config.fx_graph_cache = False
        inductor_config.compile_threads = 1  # no compile-worker pool left behind in the doctor's session
        dtype = torch.bfloat16 if device == "cuda" else torch.float32
        gen = torch.Generator().manual_seed(0)
        x, w, b = (torch.randn(*s, generator=gen) for s in ((512, 256), (256, 256), (256,)))
        x, w, b = (t.to(device=device, dtype=dtype) for t in (x, w, b))
        eager = _fn(x, w, b).float()
        torch._dynamo.reset()  # a compile earlier in this process must not answer for this one
        compiled = torch.compile(_fn, mode=mode, fullgraph=True)
        progress("torch.compile: inductor is generating and compiling kernels...")
        t0 = time.perf_counter()
        got = compiled(x, w, b).float()
        if device == "cuda":
            torch.cuda.synchronize()
        info["compile_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        compiled(x, w, b)
        if device == "cuda":
            torch.cuda.synchronize()
        info["second_call_ms"] = round((time.perf_counter() - t0) * 1e3, 2)
        rel = float((got - eager).norm() / eager.norm().clamp_min(1e-12))
        info["rel_err"] = rel
        info["tol"] = TOL
        info["kernels_generated"] = sum(
            1 for _root, _dirs, files in os.walk(cache) for f in files if f.endswith(".py")
        )
        info["mismatch"] = not (rel <= TOL)  # NaN is a mismatch too
        return info
    finally:
        if old_cache is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old_cache
        shutil.rmtree(cache, ignore_errors=True)


if __name__ == "__main__":
    main(check)
