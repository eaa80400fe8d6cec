"""Packages stage: versions against the profile, torch's own triton pin, causal-conv1d."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util

from mlstack_doctor import profile as prof
from mlstack_doctor.context import Context
from mlstack_doctor.diagnosis import fix_for
from mlstack_doctor.record import Result, Stage, failed, passed, warned


def installed(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def package_versions(ctx: Context) -> Result:
    name, stage = "package_versions", Stage.PACKAGES
    profile = ctx.opts.profile or prof.load("default")
    found = {d: installed(d) for d in prof.STACK}
    ctx.facts["installed"] = found
    ev: dict[str, object] = {"profile": profile.to_json(), "installed": found}
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
    pins = " ".join(f"'{d}=={s}'" for d, s in profile.expect.items())
    if missing:
        spec = profile.expect[missing[0]]
        return failed(
            name,
            stage,
            f"not installed: {', '.join(missing)} (profile {profile.name})",
            "PACKAGE_MISSING",
            fix_for("PACKAGE_MISSING", python=ctx.python, package=f"{missing[0]}=={spec}"),
            **ev,
        )
    if off:
        summary = "; ".join(f"{d} {i} != {e}" for d, (i, e) in off.items())
        if profile.source.endswith("uv.lock"):
            fix = f"cd {profile.source.rsplit('/', 1)[0]} && uv sync --frozen"
        else:
            fix = fix_for("VERSION_OFF_PROFILE", pins=pins)
        return failed(name, stage, f"off profile {profile.name}: {summary}", "VERSION_OFF_PROFILE", fix, **ev)
    listed = ", ".join(f"{d} {found[d]}" for d in profile.expect)
    return passed(name, stage, f"{listed} match profile {profile.name}", **ev)


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
    profile = ctx.opts.profile
    expected = profile.expect.get("triton") if profile else None
    if expected and prof.matches(triton_v, expected) and not prof.matches(pinned, expected):
        ev["override"] = (
            profile.overrides.get("triton", f"profile expects triton {expected}") if profile else None
        )
        return passed(
            name,
            stage,
            f"triton {triton_v} overrides torch's pin {pinned}, as profile {profile.name} declares",
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


def causal_conv1d(ctx: Context) -> Result:
    name, stage = "causal_conv1d", Stage.PACKAGES
    spec = importlib.util.find_spec("causal_conv1d")
    ver = installed("causal-conv1d")
    if spec is None:
        return warned(
            name,
            stage,
            "causal-conv1d missing: transformers uses its slower torch conv1d (speed only)",
            "CAUSAL_CONV1D_MISSING",
            fix_for("CAUSAL_CONV1D_MISSING", python=ctx.python),
            version=None,
        )
    return passed(name, stage, f"causal-conv1d {ver}", version=ver, origin=spec.origin)
