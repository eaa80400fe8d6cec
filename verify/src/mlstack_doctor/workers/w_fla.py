"""FLA on the GPU: its device choice, a chunked gated delta rule forward, and the backward (training).

Modes (args["mode"]): "device", "kernel" (forward vs a float64 torch reference), "backward"
(forward and backward vs the reference's autograd). The reference is the plain recurrence
S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - k_t^T exp(g_t) S_{t-1}))^T, o_t = scale * q_t^T S_t.
"""

from __future__ import annotations

import importlib.metadata
import sys
import warnings
from typing import Any

from _common import STATE, error_text, main


def _device(args: dict[str, Any]) -> dict[str, Any]:
    imported_before = "fla.utils" in sys.modules  # the session imported it: its warnings were kept then
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import fla.utils as fu
    seen = STATE.get("fla_import_warnings", []) if imported_before else [str(w.message) for w in caught]
    out: dict[str, Any] = {
        "fla_core": importlib.metadata.version("fla-core"),
        "fla_device": getattr(fu, "device", None),
        "fla_platform": getattr(fu, "device_platform", None),
        "is_nvidia_hopper": getattr(fu, "IS_NVIDIA_HOPPER", None),
        "warnings": [w for w in seen if "triton" in w.lower()][:5],
    }
    # FLA's own flag swallows Triton's exception: ask Triton in this same process and keep its text.
    import triton

    try:
        out["triton_target"] = repr(triton.runtime.driver.active.get_current_target())
    except Exception as exc:
        out["triton_exception"] = error_text(exc)
    out["ok"] = out["fla_device"] not in (None, "cpu")
    if not out["ok"]:
        out["error"] = f"FLA device is {out['fla_device']!r}: " + out.get(
            "triton_exception", "no Triton exception"
        )
    return out


def _inputs(torch: Any, seed: int, B: int, T: int, H: int, K: int, V: int, grad: bool) -> dict[str, Any]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dev, bf = "cuda", torch.bfloat16

    def rnd(*shape: int) -> Any:
        return torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32)

    q = torch.nn.functional.normalize(rnd(B, T, H, K), dim=-1)
    k = torch.nn.functional.normalize(rnd(B, T, H, K), dim=-1)
    v = rnd(B, T, H, V)
    g = torch.nn.functional.logsigmoid(rnd(B, T, H)) * 0.5
    beta = torch.sigmoid(rnd(B, T, H))
    xs = {"q": q, "k": k, "v": v, "g": g, "beta": beta}
    return {n: x.to(bf).detach().requires_grad_(grad) for n, x in xs.items()}


def _reference(torch: Any, q: Any, k: Any, v: Any, g: Any, beta: Any, scale: float) -> Any:
    q, k, v, g, beta = (x.double() for x in (q, k, v, g, beta))
    B, T, H, K = q.shape
    S = torch.zeros(B, H, K, v.shape[-1], dtype=torch.float64, device=q.device)
    outs = []
    for t in range(T):
        S = S * torch.exp(g[:, t])[..., None, None]
        err = v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], S)
        S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], err * beta[:, t][..., None])
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t] * scale, S))
    return torch.stack(outs, dim=1)


def _rel(torch: Any, got: Any, ref: Any) -> float:
    got, ref = got.double(), ref.double()
    if not bool(torch.isfinite(got).all()):
        return float("inf")
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def _kernel(args: dict[str, Any], backward: bool) -> dict[str, Any]:
    import torch
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    B, T, H, K, V = args.get("shape", [2, 200, 2, 128, 128])
    tol = float(args.get("tol", 2e-2))
    x = _inputs(torch, int(args.get("seed", 0)), B, T, H, K, V, grad=backward)
    scale = K**-0.5
    o, _ = chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], scale=scale)
    ref_in = {n: t.detach().clone().requires_grad_(backward) for n, t in x.items()}
    ref = _reference(torch, ref_in["q"], ref_in["k"], ref_in["v"], ref_in["g"], ref_in["beta"], scale)
    out: dict[str, Any] = {"shape_BTHKV": [B, T, H, K, V], "tol": tol, "fwd_rel_err": _rel(torch, o, ref)}
    out["ok"] = out["fwd_rel_err"] < tol
    if not out["ok"]:
        out["mismatch"] = "forward"
    if not backward:
        return out
    do = torch.randn(o.shape, device="cuda", dtype=torch.float32).to(o.dtype)
    ref.backward(do.double())
    o.backward(do)  # FLA's Hopper guard (#640) raises here without tilelang
    grads = {}
    for n in x:
        grads[n] = _rel(torch, x[n].grad, ref_in[n].grad)
    out["grad_rel_err"] = grads
    gtol = float(args.get("grad_tol", 5e-2))
    out["grad_tol"] = gtol
    bad = sorted(n for n, e in grads.items() if not e < gtol)
    if bad:
        out["ok"] = False
        out["mismatch"] = "backward: " + ", ".join(bad)
    return out


def check(args: dict[str, Any]) -> dict[str, Any]:
    mode = args.get("mode", "device")
    if mode == "device":
        return _device(args)
    return _kernel(args, backward=(mode == "backward"))


if __name__ == "__main__":
    main(check)
