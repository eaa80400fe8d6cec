"""The probes in dependency order, their gating, and the run loop.

A probe runs only if every prerequisite that ran in this tier passed or warned; otherwise it is
`skip` with the reason and `skipped_by` naming the ROOT failure (the first failed probe in the
chain), so summary.root_cause is always the first failure.

The GPU probes marked `session` run in ONE long-lived worker (runner.Session), started before the CPU
probes so its imports overlap them; triton_target's fresh-cache process starts then too. When the
session dies or hangs in a probe, that probe reports it and the later session probes are skipped
with skipped_by naming it.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass

from mlstack_doctor import runner, vetting
from mlstack_doctor.context import Context
from mlstack_doctor.probes import gpu, host, model, nccl, packages, toolchain, warm
from mlstack_doctor.record import Result, Stage, Status, skipped

TIERS = ("fast", "quick", "full", "stress", "warm", "nccl")
RANKED = ("quick", "full", "stress")  # each includes the one before; fast, warm, nccl are their own lists


@dataclass(frozen=True)
class Probe:
    name: str
    stage: Stage
    fn: Callable[[Context], Result]
    requires: tuple[str, ...] = ()
    needs_packages: tuple[str, ...] = ()  # distributions that must be installed (package_versions says so)
    gpu: bool = False
    min_tier: str = "quick"
    slow: bool = False
    session: bool = False  # runs in the long-lived GPU worker


PROBES: tuple[Probe, ...] = (
    Probe("nvidia_device_nodes", Stage.HOST, host.device_nodes),
    Probe("nvidia_driver", Stage.HOST, host.driver, ("nvidia_device_nodes",), gpu=True),
    Probe("cuda_visible_devices", Stage.HOST, host.cuda_visible_devices, gpu=True),
    Probe("c_compiler", Stage.TOOLCHAIN, toolchain.c_compiler),
    Probe("python_headers", Stage.TOOLCHAIN, toolchain.python_headers),
    Probe("tmpdir", Stage.TOOLCHAIN, toolchain.tmpdir),
    Probe(
        "c_extension_build",
        Stage.TOOLCHAIN,
        toolchain.c_extension_build,
        ("c_compiler", "python_headers", "tmpdir"),
    ),
    Probe("triton_cache_dir", Stage.TOOLCHAIN, toolchain.triton_cache_dir),
    Probe("package_versions", Stage.PACKAGES, packages.package_versions),
    Probe("torch_triton_pin", Stage.PACKAGES, packages.torch_triton_pin),
    Probe("causal_conv1d", Stage.PACKAGES, packages.causal_conv1d),
    Probe(
        "torch_cuda",
        Stage.TORCH,
        gpu.torch_cuda,
        ("nvidia_device_nodes", "nvidia_driver", "cuda_visible_devices"),
        ("torch",),
        gpu=True,
        slow=True,
        session=True,
    ),
    Probe(
        "triton_target",
        Stage.TRITON,
        gpu.triton_target,
        ("torch_cuda", "c_extension_build"),
        ("triton",),
        gpu=True,
        slow=True,
    ),
    Probe(
        "fla_device",
        Stage.FLA,
        gpu.fla_device,
        ("triton_target",),
        ("fla-core",),
        gpu=True,
        slow=True,
        session=True,
    ),
    Probe(
        "fla_kernel",
        Stage.FLA,
        gpu.fla_kernel,
        ("fla_device", "triton_cache_dir"),
        ("fla-core",),
        gpu=True,
        slow=True,
        session=True,
    ),
    Probe(
        "gdn_backward",
        Stage.TRAINING,
        gpu.gdn_backward,
        ("fla_kernel",),
        ("fla-core",),
        gpu=True,
        slow=True,
        session=True,
    ),
    Probe(
        "torch_compile",
        Stage.TORCH,
        gpu.torch_compile,
        ("torch_cuda", "triton_target", "triton_cache_dir"),
        ("torch", "triton"),
        gpu=True,
        slow=True,
        session=True,
    ),
    Probe("model_config", Stage.MODEL, model.model_config, slow=True),
    Probe(
        "model_forward",
        Stage.MODEL,
        model.model_forward,
        ("model_config", "torch_cuda", "triton_target", "fla_kernel", "triton_cache_dir"),
        ("torch", "transformers"),
        gpu=True,
        min_tier="full",
        slow=True,
        session=True,
    ),
    Probe(
        "triton_warm",
        Stage.WARM,
        warm.triton_warm,
        ("nvidia_driver", "cuda_visible_devices", "c_extension_build", "triton_cache_dir", "model_config"),
        ("torch", "triton", "transformers", "fla-core"),
        gpu=True,
        min_tier="warm",
        slow=True,
        session=True,
    ),
    Probe(
        "autotune_stress",
        Stage.STRESS,
        model.autotune_stress,
        ("model_config", "torch_cuda", "triton_target", "fla_kernel"),
        ("torch", "transformers"),
        gpu=True,
        min_tier="stress",
        slow=True,
    ),
    # The NCCL tier (its own list below). nccl_gpus needs the GPU; the others also run the gloo path
    # on the CPU, where the GPU prerequisites are skipped by --no-gpu and do not gate them.
    Probe(
        "nccl_gpus",
        Stage.NCCL,
        nccl.nccl_gpus,
        ("nvidia_device_nodes", "nvidia_driver", "cuda_visible_devices"),
        ("torch",),
        gpu=True,
        min_tier="nccl",
        slow=True,
    ),
    Probe("nccl_shm", Stage.NCCL, nccl.nccl_shm, min_tier="nccl"),
    Probe("nccl_topology", Stage.NCCL, nccl.nccl_topology, ("nccl_gpus",), gpu=True, min_tier="nccl"),
    # Without room in /dev/shm NCCL hangs until its timeout (seen in a container with no /dev/shm): the
    # collectives wait for nccl_shm, whose root cause is the same one, minutes sooner.
    Probe(
        "nccl_collectives",
        Stage.NCCL,
        nccl.nccl_collectives,
        ("nccl_gpus", "nccl_shm"),
        ("torch",),
        min_tier="nccl",
        slow=True,
    ),
    Probe(
        "nccl_bandwidth",
        Stage.NCCL,
        nccl.nccl_bandwidth,
        ("nccl_collectives", "nccl_topology"),
        min_tier="nccl",
    ),
)


# The fast tier: what can be proven without importing torch, Triton, FLA or transformers (the driver
# through NVML's C library, versions and torch's triton pin from package metadata), in about a second:
# for monitoring and a quick verify.yml. No session probe, no model_config (it imports transformers).
FAST_TIER = (
    "nvidia_device_nodes",
    "nvidia_driver",
    "cuda_visible_devices",
    "c_compiler",
    "python_headers",
    "tmpdir",
    "c_extension_build",
    "triton_cache_dir",
    "package_versions",
    "torch_triton_pin",
    "causal_conv1d",
)

# The warm tier: what the warm step needs to be trusted (host, toolchain, packages: the fast tier; then the
# config), then the warm itself. No torch_cuda/FLA probes: the full tier proves those; a rerun on a warm key
# stays cheap.
WARM_TIER = (*FAST_TIER, "model_config", "triton_warm")

# The NCCL tier: the host probes the GPUs need, then torch.distributed across them (gloo on the CPU
# under --no-gpu or --nccl-backend gloo).
NCCL_TIER = (
    "nvidia_device_nodes",
    "nvidia_driver",
    "cuda_visible_devices",
    "nccl_gpus",
    "nccl_shm",
    "nccl_topology",
    "nccl_collectives",
    "nccl_bandwidth",
)

LISTED = {"fast": FAST_TIER, "warm": WARM_TIER, "nccl": NCCL_TIER}


def selected(tier: str) -> list[Probe]:
    if tier in LISTED:
        return [p for p in PROBES if p.name in LISTED[tier]]
    rank = RANKED.index(tier)
    return [p for p in PROBES if p.min_tier in RANKED and RANKED.index(p.min_tier) <= rank]


def plan(ctx: Context) -> list[Probe]:
    if ctx.opts.only:
        return [p for p in PROBES if p.name in ctx.opts.only]
    return selected(ctx.opts.tier)


def _root(ctx: Context, dep: str) -> str:
    res = ctx.results[dep]
    return res.skipped_by if res.status is Status.SKIP and res.skipped_by else dep


def gate(ctx: Context, probe: Probe) -> Result | None:
    """A skip Result if the probe must not run, else None."""
    if probe.gpu and not ctx.opts.expect_gpu:
        return skipped(probe.name, probe.stage, "no GPU expected (--no-gpu)")
    s = ctx.session
    if probe.session and s is not None and s.dead and s.died_in in ctx.results:
        code = ctx.results[s.died_in].code
        return skipped(
            probe.name,
            probe.stage,
            f"skipped: the GPU worker process died in {s.died_in}{' (' + code + ')' if code else ''}",
            skipped_by=s.died_in,
        )
    for dep in probe.requires:
        res = ctx.results.get(dep)
        if res is None or res.status in (Status.PASS, Status.WARN):
            continue
        if (
            not probe.gpu
            and _is_gpu(dep)
            and ((res.status is Status.SKIP and not ctx.opts.expect_gpu) or ctx.opts.nccl_backend == "gloo")
        ):
            continue  # the gloo path runs on the CPU: GPU prerequisites (--no-gpu skips them) do not gate it
        root = _root(ctx, dep)
        code = ctx.results[root].code if root in ctx.results else None
        why = f"{dep} failed" if res.status is Status.FAIL else f"{dep} skipped"
        if root != dep:
            why += f" (root cause: {root}{' ' + code if code else ''})"
        elif code:
            why += f" ({code})"
        return skipped(probe.name, probe.stage, f"skipped: {why}", skipped_by=root)
    installed = ctx.facts.get("installed") or {d: packages.installed(d) for d in probe.needs_packages}
    for dist in probe.needs_packages:
        if installed.get(dist) is None:
            by = (
                "package_versions"
                if ctx.results.get("package_versions", None)
                and ctx.results["package_versions"].status is Status.FAIL
                else None
            )
            return skipped(probe.name, probe.stage, f"skipped: {dist} is not installed", skipped_by=by)
    return None


def _is_gpu(name: str) -> bool:
    return any(p.gpu for p in PROBES if p.name == name)


def _open(ctx: Context, probes: list[Probe], note: Callable[[str], None] | None) -> None:
    """Start the GPU session (and triton_target's fresh-cache process) before the CPU probes run.

    The session is started at once when the plan runs torch_cuda (the GPU chain); otherwise (the warm
    tier, --only) it starts on first use, so a warm tier that finds its key warm never imports torch.
    MLSTACK_DOCTOR_SESSION=0 runs each GPU probe in its own worker instead.
    """
    if not ctx.opts.expect_gpu:
        return
    names = {p.name for p in probes}
    if os.environ.get("MLSTACK_DOCTOR_SESSION", "1") != "0" and any(p.session for p in probes):
        ctx.session = runner.Session(on_progress=note)
        if "torch_cuda" in names:
            ctx.session.start(imports_timeout=ctx.timeout(600))
    if "triton_target" in names:
        gpu.start_triton_target(ctx)


def _close(ctx: Context) -> None:
    if ctx.session is not None:
        ctx.session.close()
    for bg, fresh in ctx.background.values():
        bg.cancel()
        shutil.rmtree(fresh, ignore_errors=True)
    ctx.background.clear()


def run(
    ctx: Context,
    progress: Callable[[int, int, Probe], None] | None = None,
    done: Callable[[Result], None] | None = None,
    note: Callable[[str], None] | None = None,
) -> list[Result]:
    probes = plan(ctx)
    out: list[Result] = []
    _open(ctx, probes, note)
    try:
        for i, probe in enumerate(probes):
            result = gate(ctx, probe)
            if result is None:
                if progress:
                    progress(i, len(probes), probe)
                start = time.monotonic()
                result = probe.fn(ctx)
                result.duration_s = time.monotonic() - start
            result = vetting.vet(result, ctx.facts)  # no fix reaches the report unchecked
            ctx.results[probe.name] = result
            out.append(result)
            if done:
                done(result)
    finally:
        _close(ctx)
    return out


def _cause(r: Result) -> dict[str, object]:
    return {"probe": r.name, "stage": r.stage.value, "code": r.code, "fix": r.fix, "summary": r.summary}


def independent_failures(results: list[Result]) -> list[Result]:
    """The failures no failed prerequisite explains: each starts its own chain.

    A failed probe is a root unless one of its prerequisites (Probe.requires, transitively) failed;
    a prerequisite that was skipped passes its own root on.
    """
    by_name = {r.name: r for r in results}
    table = {p.name: p for p in PROBES}

    def explained(name: str, seen: set[str]) -> bool:
        for dep in table[name].requires if name in table else ():
            if dep in seen:
                continue
            seen.add(dep)
            r = by_name.get(dep)
            if r is not None and (r.status is Status.FAIL or (r.status is Status.SKIP and r.skipped_by)):
                return True
            if explained(dep, seen):
                return True
        return False

    return [r for r in results if r.status is Status.FAIL and not explained(r.name, set())]


def summarize(results: list[Result]) -> dict[str, object]:
    counts = {s: sum(1 for r in results if r.status is s) for s in Status}
    first = next((r for r in results if r.status is Status.FAIL), None)
    return {
        "passed": counts[Status.PASS],
        "failed": counts[Status.FAIL],
        "warned": counts[Status.WARN],
        "skipped": counts[Status.SKIP],
        "ok": first is None,
        "root_cause": _cause(first) if first else None,
        "root_causes": [_cause(r) for r in independent_failures(results)],
    }
