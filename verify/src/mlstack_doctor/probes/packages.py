"""Packages stage: versions against the profile, torch's own triton pin, causal-conv1d."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import re
from pathlib import Path

from mlstack_doctor import profile as prof
from mlstack_doctor.context import Context
from mlstack_doctor.diagnosis import fix_for
from mlstack_doctor.record import Result, Stage, failed, passed, warned


def installed(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


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


def package_versions(ctx: Context) -> Result:
    name, stage = "package_versions", Stage.PACKAGES
    profile = ctx.opts.profile or prof.load("default")
    found = {d: installed(d) for d in prof.STACK}
    ctx.facts["installed"] = found
    ev: dict[str, object] = {"profile": profile.to_json(), "installed": found}
    shadow = shadowed(found)
    if shadow:
        ev["shadowed"] = shadow
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
            fix_for("PACKAGE_MISSING", python=ctx.python, package=f"{missing[0]}=={spec}"),
            **ev,
        )
    if off:
        summary = "; ".join(f"{d} {i} != {e}" for d, (i, e) in off.items())
        wanted = " ".join(f"'{d}=={e}'" for d, (_, e) in off.items())
        fix = fix_for("VERSION_OFF_PROFILE", python=ctx.python, pins=wanted)
        if profile.source.endswith("uv.lock"):  # the lock is the whole truth: sync puts every package back
            fix += f" (or the whole lock: cd {profile.source.rsplit('/', 1)[0]} && uv sync --frozen)"
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
