"""What a user's job does with the stack, small: the fault generator's ground truth of "the stack fails".

Run with the interpreter under test, in a mutation's namespace, environment, limits and uid, independent
of the doctor (it imports none of it). Each step is what training or inference does first: import the
stack, build the tiny model and run it, build a C helper as Triton does (CC or cc/gcc on PATH, Python.h,
TMPDIR), write kernels where Triton and inductor keep them (their own rules for the folder), look up the
user as they do; with --gpu also a Triton kernel, FLA's Gated DeltaNet forward and backward and a
torch.compile'd function on the GPU. Writes {step: "ok" | "<exception>"} as JSON to argv[1].

  python workload.py OUT.json [--gpu] [--config CONFIG.json]
"""

from __future__ import annotations

import getpass
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import traceback
from collections.abc import Callable
from pathlib import Path

CONFIG = Path(__file__).resolve().parents[2] / "src" / "mlstack_doctor" / "configs" / "qwen3_5_tiny.json"
# A kernel file as large as a compiled FLA kernel's (a few MB): a low file-size limit shows on writing it.
KERNEL_BYTES = 4 * 2**20


def _cache_dir(var: str, default: Callable[[], str]) -> Path:
    return Path(os.environ.get(var) or default())


def triton_cache() -> Path:
    """Triton's rule: TRITON_CACHE_DIR, else $TRITON_HOME/.triton/cache, else ~/.triton/cache."""
    home = os.environ.get("TRITON_HOME") or os.path.expanduser("~")
    return _cache_dir("TRITON_CACHE_DIR", lambda: os.path.join(home, ".triton", "cache"))


def inductor_cache() -> Path:
    """inductor's rule: TORCHINDUCTOR_CACHE_DIR, else <tmp>/torchinductor_<user>."""
    return _cache_dir(
        "TORCHINDUCTOR_CACHE_DIR",
        lambda: os.path.join(
            tempfile.gettempdir(), "torchinductor_" + getpass.getuser().replace(os.sep, "_")
        ),
    )


def write_kernel(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=folder, prefix="kernel-", delete=True) as f:
        f.write(os.urandom(KERNEL_BYTES))
        f.flush()
        os.fsync(f.fileno())


def c_helper() -> None:
    """Triton's way: $CC, else cc/gcc/clang on PATH; Python.h of this interpreter; a temp dir under TMPDIR."""
    cc = os.environ.get("CC") or next((c for c in ("cc", "gcc", "clang") if shutil.which(c)), None)
    if cc is None:
        raise RuntimeError("no C compiler: CC unset and no cc, gcc or clang on PATH")
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "helper.c"
        src.write_text("#include <Python.h>\nint helper(void) { return 0; }\n")
        include = sysconfig.get_paths()["include"]
        argv = [cc, "-shared", "-fPIC", "-O1", f"-I{include}", str(src), "-o", str(Path(tmp) / "helper.so")]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} rc {proc.returncode}: {proc.stderr.strip()[-300:]}")


def model_forward(config: Path, device: str) -> None:
    import torch
    import transformers

    raw = json.loads(config.read_text())
    cfg = transformers.AutoConfig.for_model(raw.pop("model_type"), **raw)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(cfg)
    ids = torch.randint(0, cfg.vocab_size, (1, 64), device=device)
    loss = model(input_ids=ids, labels=ids, use_cache=False).loss
    loss.backward()
    if not torch.isfinite(loss):
        raise RuntimeError(f"loss {loss.item()}")


def gpu_steps() -> dict[str, Callable[[], None]]:
    def triton_kernel() -> None:
        import torch
        import triton
        import triton.language as tl

        @triton.jit
        def add(x, y, o, n, b: tl.constexpr):
            i = tl.program_id(0) * b + tl.arange(0, b)
            m = i < n
            tl.store(o + i, tl.load(x + i, mask=m) + tl.load(y + i, mask=m), mask=m)

        x = torch.ones(1000, device="cuda")
        o = torch.empty_like(x)
        add[(4,)](x, x, o, 1000, b=256)
        torch.cuda.synchronize()
        if not bool((o == 2).all()):
            raise RuntimeError("Triton add gave a wrong answer")

    def fla_gdn() -> None:
        import torch
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule

        b, t, h, d = 1, 256, 2, 64
        q, k, v = (
            torch.randn(b, t, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in "qkv"
        )
        g = torch.nn.functional.logsigmoid(torch.randn(b, t, h, device="cuda", dtype=torch.float32))
        beta = torch.rand(b, t, h, device="cuda", dtype=torch.bfloat16).sigmoid()
        o, _ = chunk_gated_delta_rule(q, torch.nn.functional.normalize(k, dim=-1), v, g, beta)
        o.float().sum().backward()
        torch.cuda.synchronize()

    def compiled() -> None:
        import torch

        f = torch.compile(lambda x: torch.nn.functional.gelu(x @ x))
        x = torch.randn(64, 64, device="cuda")
        if not torch.allclose(f(x), torch.nn.functional.gelu(x @ x), atol=1e-2, rtol=1e-2):
            raise RuntimeError("torch.compile result differs from eager")

    return {"triton_kernel": triton_kernel, "fla_gated_delta": fla_gdn, "torch_compile": compiled}


def main(argv: list[str]) -> int:
    out, gpu = Path(argv[0]), "--gpu" in argv
    config = Path(argv[argv.index("--config") + 1]) if "--config" in argv else CONFIG
    steps: dict[str, Callable[[], None]] = {
        "user": getpass.getuser,
        "imports": lambda: __import__("transformers") and __import__("torch"),
        "c_helper": c_helper,
        "triton_cache": lambda: write_kernel(triton_cache()),
        "inductor_cache": lambda: write_kernel(inductor_cache()),
        "model": lambda: model_forward(config, "cuda" if gpu else "cpu"),
    }
    if gpu:
        steps.update(gpu_steps())
    result: dict[str, str] = {}
    for name, step in steps.items():
        try:
            step()
            result[name] = "ok"
        except BaseException as exc:  # the ground truth: any failure of a step is the stack failing
            result[name] = f"{type(exc).__name__}: {exc}"[:500]
            result[name + "_where"] = traceback.format_exc()[-800:]
    out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
