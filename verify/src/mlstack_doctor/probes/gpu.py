"""torch, Triton and FLA on the GPU, in worker processes of the interpreter under test.

The GPU probes run as requests to ONE long-lived worker (runner.Session) that imports the stack once;
without a session (--no-gpu, or MLSTACK_DOCTOR_SESSION=0) each runs its own worker script as before.
triton_target always runs in its own process with a fresh cache, started early, beside the imports.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from typing import Any

from mlstack_doctor import experiment, runner, runtime
from mlstack_doctor.context import Context
from mlstack_doctor.diagnosis import classify, fix_for
from mlstack_doctor.record import Result, Stage, failed, passed, warned

# session op -> (worker script, its args) for a run without the session
OPS: dict[str, tuple[str, dict[str, Any]]] = {
    "torch_cuda": ("w_torch_cuda.py", {}),
    "fla_device": ("w_fla.py", {"mode": "device"}),
    "fla_kernel": ("w_fla.py", {"mode": "kernel"}),
    "gdn_backward": ("w_fla.py", {"mode": "backward"}),
    "torch_compile": ("w_compile.py", {}),
    "model_config": ("w_model.py", {"mode": "config"}),
    "model_forward": ("w_model.py", {"mode": "forward"}),
    "warm": ("w_model.py", {"mode": "warm"}),
}


def call(
    ctx: Context, probe: str, op: str, args: dict[str, Any], *, timeout: float, only_if_started: bool = False
) -> runner.WorkerResult:
    """Run `op` in the session when there is one (alive; started, if only_if_started), else on its own."""
    s = ctx.session
    if s is None or s.dead or (only_if_started and not s.started):
        script, extra = OPS[op]
        return runner.run_worker(script, {**args, **extra}, timeout=timeout)
    return s.call(op, args, probe=probe, timeout=timeout)


def session_evidence(ctx: Context) -> dict[str, Any]:
    s = ctx.session
    if s is None or not s.started:
        return {}
    return {
        "session": {
            "pid": s.pid,
            "imports_s": s.imports.get("imports_s"),
            "import_errors": s.imports.get("import_errors") or None,
        }
    }


def start_triton_target(ctx: Context) -> None:
    """Start the fresh-cache Triton target check now (the engine does, before the CPU probes)."""
    fresh = tempfile.mkdtemp(prefix="mlstack-doctor-triton-")
    bg = runner.Background(
        "w_triton_target.py", {}, timeout=ctx.timeout(180), env={"TRITON_CACHE_DIR": fresh}
    )
    ctx.background["triton_target"] = (bg, fresh)


def failure_code(res: runner.WorkerResult, default: str, text: str) -> str:
    """The code for a worker that did not succeed: it hung, died without an answer, or answered an error
    (then `default` unless `text` names a more specific cause)."""
    if res.run.timed_out:
        return "PROBE_TIMEOUT"
    if not res.answered:
        return classify(text, "PROBE_CRASHED")
    return classify(text, default)


# Each probe's worker as it runs on its own: what the experiment reruns (runtime.by_experiment). A probe
# whose worker takes arguments of the run (model_config's config, model_forward's model) passes its own
# `rerun` to _fail instead.
RERUN: dict[str, tuple[str, dict[str, Any]]] = {
    "torch_cuda": OPS["torch_cuda"],
    "triton_target": ("w_triton_target.py", {}),
    "fla_device": OPS["fla_device"],
    "fla_kernel": OPS["fla_kernel"],
    "gdn_backward": OPS["gdn_backward"],
    "torch_compile": ("w_compile.py", {"device": "cuda"}),
}


def experiment_for(
    ctx: Context,
    name: str,
    res: runner.WorkerResult,
    ex: runtime.Explained,
    rerun: tuple[str, dict[str, Any]] | None = None,
) -> None:
    """A failure no rule explains: rerun the probe's worker (`rerun`: its script and args, else RERUN's)
    in a clean baseline and narrow the differences (experiment.py); one experiment per worker and its args
    (ex is updated in place)."""
    rerun = rerun or RERUN.get(name)
    if rerun is None or not runtime.wants_experiment(res, ex):
        return
    if ex.code == "GPU_OUT_OF_MEMORY":
        held = ex.evidence["gpu_memory"] = _memory(res)
        if held.get("held_outside_gib", 0) > 0.25 * held.get("total_gib", 0):
            return  # the evidence names the load: others hold the memory; no setting is suspected
    script, args = rerun
    key = f"{script} {json.dumps(args, sort_keys=True)}"
    trial = experiment.worker_trial(script, args, ctx.timeout(300))
    # A failure in the long-lived session is first rerun on its own with every setting in place (it may
    # not come back there); one of this very worker script already was.
    alone = any(a.endswith("/" + script) for a in res.run.argv)
    runtime.by_experiment(ex, ctx.facts, key, trial, reproduced=alone)


def _memory(res: runner.WorkerResult) -> dict[str, Any]:
    """Who holds the GPU's memory: torch's own message, and NVML's list of processes."""
    nvml = runner.run_worker("w_nvml.py", {"mode": "memory"}, timeout=30)
    return runtime.memory_held(
        res.error_text + "\n" + res.run.stderr[-20000:], nvml.data or {"error": "no answer"}
    )


def _fail(
    name: str,
    stage: Stage,
    ctx: Context,
    res: runner.WorkerResult,
    default: str,
    what: str,
    fix_args: dict[str, str] | None = None,
    *,
    rerun: tuple[str, dict[str, Any]] | None = None,
    **ev: object,
) -> Result:
    """The failed Result of a worker that did not succeed, for every probe that runs stack code: the code
    and fix values its text names (runtime.explain), else the cause the experiment finds by rerunning
    `rerun` (the worker's script and args; RERUN's by default)."""
    # A module the session failed to import is the first error; what fails after it in the same process
    # (torch 2.11: "Artifact of type=inductor already registered") only echoes it.
    s = ctx.session
    earlier = (s.imports.get("import_errors") or {}) if s is not None and s.started else {}
    if earlier:
        ev = {**ev, "session_import_errors": earlier}
    ex = runtime.explain(res, default, ctx.facts, also="\n".join(earlier.values()))
    experiment_for(ctx, name, res, ex, rerun)
    code = ex.code
    ev = {**ev, **res.evidence(), **ex.evidence}
    exception = res.error_text.strip()
    fix = fix_for(
        code,
        python=ctx.python,
        py_ver=ctx.py_ver,
        kernel_driver=ctx.facts.get("kernel_driver"),
        cache_dir=ctx.facts.get("triton_cache_dir"),
        package=res.error_text.split("'")[1]
        if code == "PACKAGE_MISSING" and "'" in res.error_text
        else "<package>",
        exception=exception.splitlines()[-1][:300] if exception else "no exception text",
        **{**(fix_args or {}), **ex.fix_args},
    )
    if code == "GPU_OUT_OF_MEMORY":
        held = ex.evidence.get("gpu_memory") or _memory(res)
        ev["gpu_memory"] = held
        if runtime.memory_sentence(held):
            fix += f" ({runtime.memory_sentence(held)})"
    fix += runtime.experiment_note(ex.evidence.get("experiment"))
    if code == "PROBE_CRASHED" and ex.evidence.get("signal"):  # what the signal's victim said last
        last = ex.fix_args.get("last", "none")
        fix += f" (the worker died of {ex.evidence['signal']}; its last lines: {last})"
    # the words the code was read from, where a rule matched; else the exception's last line
    detail = ex.evidence.get("classified_from") or (
        exception.splitlines()[-1][:300] if exception else f"worker rc {res.run.rc}, no output"
    )
    return failed(name, stage, f"{what}: {detail}", code, fix, **ev)


def torch_cuda(ctx: Context) -> Result:
    name, stage = "torch_cuda", Stage.TORCH
    res = call(ctx, name, "torch_cuda", {}, timeout=ctx.timeout(120))
    data = {k: v for k, v in res.data.items() if k not in ("ok", "error", "traceback", "id")}
    data.update(session_evidence(ctx))
    if not res.ok:
        if res.data.get("torch_cuda") is None and res.answered:
            default = "TORCH_NO_CUDA"
        elif ctx.facts.get("uvm_missing"):
            default = "NVIDIA_UVM_MISSING"
        else:
            default = "CUDA_UNAVAILABLE"
        return _fail(name, stage, ctx, res, default, "torch cannot use CUDA", **data)
    ctx.facts["gpus"] = data["gpus"]
    if not data.get("device_count"):
        return failed(name, stage, "torch sees 0 GPUs", "CUDA_HIDDEN", fix_for("CUDA_HIDDEN"), **data)
    if not data.get("matmul_ok"):
        return failed(
            name,
            stage,
            f"a GPU matmul disagrees with the CPU (rel err {data['matmul_rel_err']:.2e})",
            "CUDA_UNAVAILABLE",
            fix_for("CUDA_UNAVAILABLE"),
            **data,
        )
    gpus = ", ".join(
        f"{g['name']} (sm_{g['capability'].replace('.', '')}, {g['memory_gib']} GiB)" for g in data["gpus"]
    )
    return passed(name, stage, f"torch {data['torch']} CUDA {data['torch_cuda']}: {gpus}", **data)


def triton_target(ctx: Context) -> Result:
    """get_current_target() with a FRESH cache dir: a warm cache would hide a broken compiler."""
    name, stage = "triton_target", Stage.TRITON
    if "triton_target" not in ctx.background:
        start_triton_target(ctx)
    bg, fresh = ctx.background.pop("triton_target")
    try:
        res = bg.result()
    finally:
        shutil.rmtree(fresh, ignore_errors=True)
    data = {k: v for k, v in res.data.items() if k not in ("ok", "error", "traceback")}
    data["fresh_cache_dir"] = fresh
    if not res.ok:
        return _fail(
            name, stage, ctx, res, "TRITON_TARGET_FAILED", "Triton get_current_target() failed", **data
        )
    if data.get("backend") != "cuda":
        return failed(
            name,
            stage,
            f"Triton backend is {data.get('backend')!r}, not 'cuda'",
            "TRITON_TARGET_FAILED",
            fix_for("TRITON_TARGET_FAILED", python=ctx.python),
            **data,
        )
    return passed(
        name,
        stage,
        f"triton {data['triton']}: {data['target']} (fresh cache, own process, {res.run.duration_s:.1f} s)",
        **data,
    )


def fla_device(ctx: Context) -> Result:
    name, stage = "fla_device", Stage.FLA
    res = call(ctx, name, "fla_device", {}, timeout=ctx.timeout(180))
    data = {k: v for k, v in res.data.items() if k not in ("ok", "error", "traceback", "id")}
    if res.answered and res.data.get("fla_device") == "cpu":
        return failed(
            name,
            stage,
            f"FLA picked device 'cpu'; Triton says: {data.get('triton_exception')}",
            "FLA_ON_CPU",
            fix_for("FLA_ON_CPU"),
            **data,
            **res.evidence(),
        )
    if not res.ok:
        return _fail(name, stage, ctx, res, "FLA_ON_CPU", "FLA import failed", **data)
    return passed(
        name,
        stage,
        f"fla-core {data['fla_core']}: device {data['fla_device']!r}, Triton {data.get('triton_target')}",
        **data,
    )


def fla_kernel(ctx: Context) -> Result:
    name, stage = "fla_kernel", Stage.FLA
    res = call(ctx, name, "fla_kernel", {}, timeout=ctx.timeout(300))
    data = {k: v for k, v in res.data.items() if k not in ("ok", "error", "traceback", "id")}
    if res.answered and res.data.get("mismatch"):
        return failed(
            name,
            stage,
            f"chunk_gated_delta_rule forward differs from the torch reference "
            f"(rel err {data['fwd_rel_err']:.2e} > {data['tol']})",
            "FLA_KERNEL_MISMATCH",
            fix_for("FLA_KERNEL_MISMATCH"),
            **data,
        )
    if not res.ok:
        return _fail(name, stage, ctx, res, "FLA_KERNEL_FAILED", "chunk_gated_delta_rule failed", **data)
    return passed(
        name,
        stage,
        f"chunk_gated_delta_rule fwd matches the float64 reference (rel err "
        f"{data['fwd_rel_err']:.1e}) in {res.run.duration_s:.1f} s",
        **data,
    )


def gdn_backward(ctx: Context) -> Result:
    name, stage = "gdn_backward", Stage.TRAINING
    res = call(ctx, name, "gdn_backward", {}, timeout=ctx.timeout(400))
    data = {k: v for k, v in res.data.items() if k not in ("ok", "error", "traceback", "id")}
    if res.answered and res.data.get("mismatch"):
        return failed(
            name,
            stage,
            f"Gated DeltaNet {data['mismatch']} differs from the torch reference",
            "FLA_BACKWARD_MISMATCH",
            fix_for("FLA_BACKWARD_MISMATCH", python=ctx.python),
            **data,
        )
    if not res.ok:
        if failure_code(res, "FLA_KERNEL_FAILED", res.error_text) == "FLA_BACKWARD_NEEDS_TILELANG":
            return backward_refused(
                ctx, name, stage, f"FLA refuses the Gated DeltaNet backward: {res.error_text[:200]}", **data
            )
        return _fail(name, stage, ctx, res, "FLA_KERNEL_FAILED", "Gated DeltaNet backward failed", **data)
    worst = max(data["grad_rel_err"].values())
    return passed(
        name, stage, f"Gated DeltaNet fwd+bwd match the reference (worst grad rel err {worst:.1e})", **data
    )


def backward_refused(ctx: Context, name: str, stage: Stage, summary: str, **ev: Any) -> Result:
    """FLA refuses the Gated DeltaNet backward (FLA #640): a failure for a container meant to train, a
    warning for one meant only for inference (the forward is what it runs)."""
    code = "FLA_BACKWARD_NEEDS_TILELANG"
    fix = fix_for(code, python=ctx.python)
    if ctx.opts.purpose == "inference":
        return warned(name, stage, f"{summary} (purpose inference: forward only)", code, fix, **ev)
    return failed(name, stage, f"{summary}: this stack cannot train (purpose training)", code, fix, **ev)


def torch_compile(ctx: Context) -> Result:
    """torch.compile of a small function on the GPU against eager: inductor uses the installed Triton, so
    a profile that overrides torch's triton pin must prove it did not break it."""
    name, stage = "torch_compile", Stage.TORCH
    res = call(ctx, name, "torch_compile", {"device": "cuda"}, timeout=ctx.timeout(300))
    data = {k: v for k, v in res.data.items() if k not in ("ok", "error", "traceback", "id")}
    pin_ev = ctx.results["torch_triton_pin"].evidence if "torch_triton_pin" in ctx.results else {}
    torch_pin = f"triton=={pin_ev['torch_pins_triton']}" if pin_ev.get("torch_pins_triton") else "triton"
    if res.answered and res.data.get("mismatch"):
        return failed(
            name,
            stage,
            f"torch.compile's result differs from eager (rel err {data.get('rel_err')} > {data.get('tol')})",
            "TORCH_COMPILE_MISMATCH",
            fix_for("TORCH_COMPILE_MISMATCH", python=ctx.python, torch_pin=torch_pin),
            **data,
        )
    if not res.ok:
        fix_args = {"torch_pin": torch_pin}
        return _fail(name, stage, ctx, res, "TORCH_COMPILE_FAILED", "torch.compile failed", fix_args, **data)
    return passed(
        name,
        stage,
        f"torch.compile (inductor, triton {data.get('triton')}) matches eager "
        f"(rel err {data['rel_err']:.1e}); compiled in {data['compile_s']} s",
        **data,
    )
