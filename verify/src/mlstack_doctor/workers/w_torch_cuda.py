"""torch sees CUDA: version, GPUs, compute capability, and a small matmul that agrees with the CPU."""

from __future__ import annotations

from typing import Any

from _common import error_text, main


def check(args: dict[str, Any]) -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "available": torch.cuda.is_available(),
    }
    if torch.version.cuda is None:
        return {**info, "ok": False, "error": "torch is a CPU-only build (torch.version.cuda is None)"}
    if not info["available"]:
        # is_available() hides the reason: ask CUDA for it.
        try:
            torch.cuda.init()
            reason = "torch.cuda.is_available() is False"
        except RuntimeError as exc:
            reason = error_text(exc)
        return {**info, "ok": False, "error": reason}
    gpus = []
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        gpus.append(
            {
                "index": i,
                "name": props.name,
                "capability": f"{props.major}.{props.minor}",
                "memory_gib": round(props.total_memory / 2**30, 1),
                "multiprocessors": props.multi_processor_count,
            }
        )
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(256, 256, generator=gen)
    b = torch.randn(256, 256, generator=gen)
    ref = a.double() @ b.double()
    got = (a.cuda() @ b.cuda()).double().cpu()
    rel = float((got - ref).norm() / ref.norm())
    return {**info, "device_count": len(gpus), "gpus": gpus, "matmul_rel_err": rel, "matmul_ok": rel < 1e-2}


if __name__ == "__main__":
    main(check)
