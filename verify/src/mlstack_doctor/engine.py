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
from mlstack_doctor.context import Context, Options
from mlstack_doctor.probes import caches, disks, gpu, host, model, nccl, packages, process, toolchain, warm
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
    # A GPU probe that still runs under --no-gpu when this says so (its file work needs no GPU).
    cpu_part: Callable[[Options], bool] | None = None
    min_tier: str = "quick"
    slow: bool = False
    session: bool = False  # runs in the long-lived GPU worker


PROBES: tuple[Probe, ...] = (
    # The limits, identity and settings every later process inherits: a fault there surfaces deep
    # inside torch, CUDA or Triton, so the probes that start those wait for it.
    Probe("process_env", Stage.HOST, process.process_env),
    Probe("disk_space", Stage.HOST, disks.disk_space),
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
    # Entries that cannot be loaded: the probes that load kernels from the caches wait for this one.
    Probe("kernel_caches", Stage.TOOLCHAIN, caches.kernel_caches),
    Probe("package_versions", Stage.PACKAGES, packages.package_versions),
    Probe("torch_triton_pin", Stage.PACKAGES, packages.torch_triton_pin),
    Probe("causal_conv1d", Stage.PACKAGES, packages.causal_conv1d),
    Probe(
        "torch_cuda",
        Stage.TORCH,
        gpu.torch_cuda,
        ("process_env", "nvidia_device_nodes", "nvidia_driver", "cuda_visible_devices"),
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
        ("fla_device", "triton_cache_dir", "kernel_caches"),
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
        ("torch_cuda", "triton_target", "triton_cache_dir", "kernel_caches"),
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
        ("model_config", "torch_cuda", "triton_target", "fla_kernel", "triton_cache_dir", "kernel_caches"),
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
        (
            "process_env",
            "nvidia_driver",
            "cuda_visible_devices",
            "c_extension_build",
            "triton_cache_dir",
            "kernel_caches",  # never warm on top of entries that cannot be loaded
            "model_config",
        ),
        ("torch", "triton", "transformers", "fla-core"),
        gpu=True,
        cpu_part=lambda o: o.warm_share is not None,  # the cluster's cache is checked and installed
        min_tier="warm",
        slow=True,
        session=True,
    ),
    Probe(
        "autotune_stress",
        Stage.STRESS,
        model.autotune_stress,
        ("model_config", "torch_cuda", "triton_target", "fla_kernel", "kernel_caches"),
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
        ("process_env", "nvidia_device_nodes", "nvidia_driver", "cuda_visible_devices"),
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
        ("process_env", "nccl_gpus", "nccl_shm"),
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
    "process_env",
    "disk_space",
    "nvidia_device_nodes",
    "nvidia_driver",
    "cuda_visible_devices",
    "c_compiler",
    "python_headers",
    "tmpdir",
    "c_extension_build",
    "triton_cache_dir",
    "kernel_caches",
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
    "process_env",
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
    if probe.gpu and not ctx.opts.expect_gpu and not (probe.cpu_part and probe.cpu_part(ctx.opts)):
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
        if res.status is Status.SKIP and not ctx.opts.expect_gpu and _is_gpu(dep):
            continue  # --no-gpu skipped it; a probe that runs anyway (its CPU part) is not gated by it
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
            result = vetting.vet(result, ctx.facts, ctx.results)  # no fix reaches the report unchecked
            ctx.results[probe.name] = result
            out.append(result)
            if done:
                done(result)
    finally:
        _close(ctx)
    return out


def _cause(r: Result) -> dict[str, object]:
    return {"probe": r.name, "stage": r.stage.value, "code": r.code, "fix": r.fix, "summary": r.summary}


def _text(r: Result) -> str:
    """What a failure showed: its summary, exception and stderr (where a consequence's evidence lies)."""
    ev = r.evidence
    parts = [r.summary, str(ev.get("exception") or ""), str(ev.get("stderr_tail") or "")]
    parts += [str(v) for v in (ev.get("session_import_errors") or {}).values()]
    return "\n".join(parts)


def _last_line(r: Result) -> str:
    text = str(r.evidence.get("exception") or "").strip()
    return text.splitlines()[-1].strip() if text else ""


def explained_by(r: Result, roots: list[Result], by_name: dict[str, Result]) -> tuple[str, str] | None:
    """(the earlier root cause, why) when `r` follows from it, else None. In order: a failed or skipped
    prerequisite; the same exception; the same code and fix (one thing to do); a marker the cause
    published (evidence.explains: the variable, the folder, the error text it leads to)."""
    table = {p.name: p for p in PROBES}

    def root_of(name: str, seen: set[str]) -> str | None:
        for dep in table[name].requires if name in table else ():
            if dep in seen:
                continue
            seen.add(dep)
            d = by_name.get(dep)
            if d is not None and d.status is Status.SKIP and d.skipped_by:
                return d.skipped_by
            if d is not None and d.status is Status.FAIL:
                return root_of(dep, seen) or dep
            found = root_of(dep, seen)
            if found:
                return found
        return None

    pre = root_of(r.name, set())
    if pre is not None:
        return pre, f"its prerequisite chain failed at {pre}"
    text, line = _text(r), _last_line(r)
    for root in roots:
        other = _last_line(root)
        if other and len(other) > 20 and (other == line or other in text):
            return root.name, f"the same exception: {other[:160]}"
        if r.code == root.code and r.fix == root.fix:
            return root.name, f"the same cause and fix ({r.code})"
        hit = next((m for m in root.evidence.get("explains") or [] if m and m in text), None)
        if hit:
            return root.name, f"its evidence shows {hit!r}, which {root.name} found"
    return None


def chains(results: list[Result]) -> list[tuple[Result, list[dict[str, str | None]]]]:
    """The independent root causes, each with the failures that follow from it (its consequences)."""
    by_name = {r.name: r for r in results}
    roots: list[tuple[Result, list[dict[str, str | None]]]] = []
    for r in results:
        if r.status is not Status.FAIL:
            continue
        cause = explained_by(r, [c for c, _ in roots], by_name)
        if cause is None:
            roots.append((r, []))
            continue
        name, why = cause
        # a prerequisite's root that is itself a consequence: file it under that one's cause
        owner = next((c for c in roots if c[0].name == name), None) or next(
            (c for c in roots if any(x["probe"] == name for x in c[1])), None
        )
        if owner is None:  # what it follows from is no failure of this run (a tier's skip): its own cause
            roots.append((r, []))
        else:
            owner[1].append({"probe": r.name, "code": r.code, "why": why})
    return roots


def independent_failures(results: list[Result]) -> list[Result]:
    """The failures no earlier failure explains: each starts its own chain (see explained_by)."""
    return [r for r, _ in chains(results)]


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
        "root_causes": [{**_cause(r), "consequences": cons} for r, cons in chains(results)],
    }
