"""Packages stage: versions against the profile, torch's own triton pin, causal-conv1d."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import os
import re
from pathlib import Path

from mlstack_doctor import profile as prof
from mlstack_doctor.context import Context
from mlstack_doctor.diagnosis import fix_for
from mlstack_doctor.facts import stack
from mlstack_doctor.record import Result, Stage, failed, passed, warned


def installed(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def requires(dist: str) -> list[str]:
    """Its Requires-Dist lines; [] where it is not installed."""
    try:
        return md.requires(dist) or []
    except md.PackageNotFoundError:
        return []


# Packages the stack policy's rules name beside the stack (read for those rules only).
POLICY_ONLY = ("nvidia-cuda-runtime", "tilelang")

# What each stack distribution is imported as.
IMPORT_NAMES = {
    "torch": "torch",
    "triton": "triton",
    "fla-core": "fla",
    "transformers": "transformers",
    "causal-conv1d": "causal_conv1d",
}


def shadowed(dists: dict[str, str | None]) -> dict[str, dict[str, str]]:
    """Installed distributions whose import name resolves to something else: a ./triton/ or fla.py in
    the working directory or on PYTHONPATH comes first on sys.path and wins over site-packages."""
    out: dict[str, dict[str, str]] = {}
    for dist, module in IMPORT_NAMES.items():
        if not dists.get(dist) and installed(dist) is None:
            continue
        try:
            spec = importlib.util.find_spec(module)
            home = Path(str(md.distribution(dist).locate_file(""))).resolve()
        except (ImportError, ValueError, md.PackageNotFoundError):
            continue
        where = spec.origin if spec and spec.origin else None
        if where is None and spec and spec.submodule_search_locations:
            where = next(iter(spec.submodule_search_locations))
        if where is None:
            continue
        path = Path(where).resolve()
        if home not in path.parents:
            wins = str(path.parent if path.name in ("__init__.py",) else path)
            out[dist] = {"module": module, "imported_from": wins, "installed_in": str(home)}
    return out


def unreadable_file(text: str) -> str | None:
    """The package folder holding a file an import could not read ("[Errno 13] Permission denied:
    '.../site-packages/torch/...'"): a package installed by root with umask 077 imports for root only."""
    m = re.search(r"Permission denied: '([^']*(?:site|dist)-packages/)([^'/]*)", text)
    return m.group(1) + m.group(2) if m else None


def unreadable_dirs(found: dict[str, str | None]) -> list[str]:
    """Installed stack packages whose folder this user cannot list or enter (a venv installed by root
    with umask 077, a 0700 bind mount): importing them fails, in ways that do not say so."""
    out: list[str] = []
    for dist, module in IMPORT_NAMES.items():
        if not found.get(dist) and installed(dist) is None:
            continue
        try:
            home = Path(str(md.distribution(dist).locate_file("")))
        except (ValueError, md.PackageNotFoundError):
            continue
        folder = home / module
        if folder.is_dir() and not os.access(folder, os.R_OK | os.X_OK):
            out.append(str(folder))
    return out


def _gpu_archs(ctx: Context) -> list[str]:
    """The archs (sm_90) of the GPUs NVML or torch reported earlier in this run; [] where none did."""
    gpus = ctx.facts.get("nvml_gpus") or ctx.facts.get("gpus") or []
    return sorted(
        {a for g in gpus if isinstance(g, dict) and (a := stack.arch_of(g.get("compute_capability")))}
    )


def package_versions(ctx: Context) -> Result:
    name, stage = "package_versions", Stage.PACKAGES
    profile = ctx.opts.profile or prof.unpinned()
    found = {d: installed(d) for d in prof.STACK}
    ctx.facts["installed"] = found
    # The shipped profiles and the policy's rules, where this doctor can read them (profile.ProfileError:
    # a checkout's python without PyYAML): unread, the match and the rules are not evaluated, not guessed.
    unread = None
    try:
        matched = prof.matching_shipped(found)
        rules_of_policy = prof.shipped_data()["rules"]
    except prof.ProfileError as exc:
        matched, rules_of_policy, unread = [], [], f"shipped profiles not read: {exc}"
        ctx.facts["shipped_unread"] = unread
    ctx.facts["matches_shipped"] = matched
    ev: dict[str, object] = {
        "profile": profile.to_json(),
        "installed": found,
        "matches_shipped": None if unread else matched,
    }
    shadow = shadowed(found)
    locked = unreadable_dirs(found)
    if locked:
        ev["unreadable"] = locked
        ev["explains"] = [*locked, "Permission denied", "Could not import module"]
        return failed(
            name,
            stage,
            f"package folders this user cannot read: {', '.join(locked)}",
            "PACKAGE_UNREADABLE",
            fix_for("PACKAGE_UNREADABLE", path=" ".join(locked)),
            **ev,
        )
    if shadow:
        ev["shadowed"] = shadow
        # what importing through the shadow raises later: the same folder, a submodule it lacks
        ev["explains"] = [
            m for x in shadow.values() for m in (x["imported_from"], f"No module named '{x['module']}.")
        ]
        dist, s = next(iter(shadow.items()))
        return failed(
            name,
            stage,
            f"import {s['module']} loads {s['imported_from']}, not {dist} installed in {s['installed_in']}",
            "PACKAGE_SHADOWED",
            fix_for("PACKAGE_SHADOWED", path=s["imported_from"]),
            **ev,
        )
    missing = [d for d, spec in profile.expect.items() if found.get(d) is None]
    off = {
        d: (found[d], spec)
        for d, spec in profile.expect.items()
        if found.get(d) and not prof.matches(found[d], spec)
    }
    ev["missing"], ev["off_profile"] = (
        missing,
        {d: {"installed": i, "expected": e} for d, (i, e) in off.items()},
    )
    if missing:
        spec = profile.expect[missing[0]]
        return failed(
            name,
            stage,
            f"not installed: {', '.join(missing)} (profile {profile.name})",
            "PACKAGE_MISSING",
            fix_for(
                "PACKAGE_MISSING",
                python=ctx.python,
                package=missing[0] + ("" if spec == prof.ANY else f"=={spec}"),
            ),
            **ev,
        )
    if off:
        summary = "; ".join(f"{d} {i} != {e}" for d, (i, e) in off.items())
        wanted = " ".join(f"'{d}=={e}'" for d, (_, e) in off.items())
        fix = fix_for("VERSION_OFF_PROFILE", python=ctx.python, pins=wanted)
        if profile.source.endswith("uv.lock"):  # the lock is the whole truth: sync puts every package back
            fix += f" (or the whole lock: cd {profile.source.rsplit('/', 1)[0]} && uv sync --frozen)"
        return failed(name, stage, f"off profile {profile.name}: {summary}", "VERSION_OFF_PROFILE", fix, **ev)
    unpaired = prof.unpaired_fla(found, requires("flash-linear-attention"))
    if unpaired:
        ev["fla_core_unpaired"] = unpaired
        return failed(
            name,
            stage,
            f"flash-linear-attention {unpaired['flash-linear-attention']} pins {unpaired['pins']}, "
            f"fla-core is {unpaired['installed']}",
            "FLA_CORE_UNPAIRED",
            fix_for("FLA_CORE_UNPAIRED", python=ctx.python, pins=f"'{unpaired['pins']}'"),
            **ev,
        )
    listed = ", ".join(f"{d} {found[d]}" for d in profile.expect)
    checked = f"match profile {profile.name}" if profile.pinned else "installed (no profile: no pins checked)"
    shipped = (
        f"; the stack is shipped profile {', '.join(matched)}" if matched else "; no shipped profile matches"
    )
    summary = f"{listed} {checked}{'' if profile.pinned and not matched else shipped}"
    archs = _gpu_archs(ctx)
    if unread:
        ev["policy"] = {"archs": archs, "rules": [], "not_evaluated": unread}
        summary = (
            f"{listed} {checked}; no shipped profile match and no stack policy rule evaluated ({unread})"
        )
        return warned(name, stage, summary, None, None, **ev)
    if not archs:
        ev["policy"] = {
            "archs": [],
            "rules": [],
            "not_evaluated": "no GPU architecture known: the rules are per GPU",
        }
        return passed(name, stage, summary, **ev)
    versions = {**found, **{d: installed(d) for d in POLICY_ONLY}}
    rules = stack.applying(rules_of_policy, versions, archs, ctx.opts.purpose)
    ev["policy"] = {"archs": archs, "rules": rules}
    bad = [r for r in rules if r["action"] == "refuse"] or [
        r for r in rules if r["action"] in ("warn", "add_extra")
    ]
    if not bad:
        return passed(name, stage, summary, **ev)
    said = "; ".join(f"{r['id']} ({', '.join(r['archs'])}): {r['says']}" for r in bad)
    verdict = failed if bad[0]["action"] == "refuse" else warned
    return verdict(
        name, stage, f"stack policy: {said}", "STACK_POLICY_RULE", fix_for("STACK_POLICY_RULE"), **ev
    )


def torch_triton_pin(ctx: Context) -> Result:
    name, stage = "torch_triton_pin", Stage.PACKAGES
    torch_v, triton_v = installed("torch"), installed("triton")
    ev: dict[str, object] = {"torch": torch_v, "triton": triton_v}
    if torch_v is None:
        return passed(name, stage, "torch not installed: no pin to check (package_versions reports it)", **ev)
    pins = [p for p in (prof.pin_of(r) for r in (md.requires("torch") or [])) if p and p[0] == "triton"]
    if not pins:
        return passed(name, stage, f"torch {torch_v} pins no triton (CPU or ROCm build)", **ev)
    pinned = pins[0][1]
    ev["torch_pins_triton"] = pinned
    if triton_v is None:
        return warned(
            name,
            stage,
            f"torch {torch_v} pins triton=={pinned} but triton is not installed",
            "PACKAGE_MISSING",
            fix_for("PACKAGE_MISSING", python=ctx.python, package=f"triton=={pinned}"),
            **ev,
        )
    if prof.matches(triton_v, pinned):
        return passed(name, stage, f"triton {triton_v} is torch's pin", **ev)
    declared = prof.declared_override(
        ctx.opts.profile, ctx.facts.get("matches_shipped") or [], "triton", triton_v
    )
    if declared and not prof.matches(pinned, declared.expect["triton"]):
        ev["override"] = declared.overrides.get(
            "triton", f"profile expects triton {declared.expect['triton']}"
        )
        return passed(
            name,
            stage,
            f"triton {triton_v} overrides torch's pin {pinned}, as profile {declared.name} declares",
            **ev,
        )
    unread = ctx.facts.get("shipped_unread")
    if unread and not (ctx.opts.profile and ctx.opts.profile.pinned):
        ev["not_evaluated"] = unread
        return warned(
            name,
            stage,
            f"triton {triton_v} is not torch's pin {pinned}; whether a shipped profile declares that "
            f"override is not known ({unread})",
            None,
            None,
            **ev,
        )
    return warned(
        name,
        stage,
        f"triton {triton_v} is not torch's pin {pinned} and the profile does not declare the override",
        "TRITON_PIN_OVERRIDDEN",
        fix_for("TRITON_PIN_OVERRIDDEN", python=ctx.python, torch_pin=f"triton=={pinned}"),
        **ev,
    )


# Measured on an H100 80GB (docs/benchmarks.md): the short convolution alone, forward + backward per Gated
# DeltaNet layer at 4096 tokens (train_speed.py --conv-only), and the 27B training step with each path
# (train_speed.py: 64 layers estimated from 4 and 8 measured, default profile).
CONV_TORCH_MS, CONV_FAST_MS = 2.07, 0.95
CONV_STEP_TORCH_S, CONV_STEP_FAST_S = 1.367, 1.271


def causal_conv1d(ctx: Context) -> Result:
    """causal-conv1d is a speed-only extra: without it transformers runs the Gated DeltaNet short
    convolution on its torch path. That is a note with its measured cost, not a warning on every run."""
    name, stage = "causal_conv1d", Stage.PACKAGES
    spec = importlib.util.find_spec("causal_conv1d")
    ver = installed("causal-conv1d")
    if spec is None:
        extra = (CONV_STEP_TORCH_S - CONV_STEP_FAST_S) * 1000
        share = extra / (CONV_STEP_FAST_S * 1000)
        return passed(
            name,
            stage,
            f"causal-conv1d not installed (speed only): transformers' torch convolution, measured "
            f"{CONV_TORCH_MS} ms against a fused kernel's {CONV_FAST_MS} ms per Gated DeltaNet layer "
            f"(forward + backward, 4096 tokens, H100); the 27B training step {CONV_STEP_TORCH_S} s against "
            f"{CONV_STEP_FAST_S} s: about {extra:.0f} ms ({share:.0%}) more per 4096-token step",
            version=None,
            note="speed only: the short convolution runs on transformers' torch path",
            measured_ms={
                "torch": CONV_TORCH_MS,
                "fused": CONV_FAST_MS,
                "per_27b_step_extra": round(extra),
                "step_torch": round(CONV_STEP_TORCH_S * 1000),
                "step_fused": round(CONV_STEP_FAST_S * 1000),
            },
        )
    return passed(name, stage, f"causal-conv1d {ver}", version=ver, origin=spec.origin)
