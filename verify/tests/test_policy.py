"""The stack policy's rules as the doctor evaluates them (facts/stack.py over the shipped rules)."""

from __future__ import annotations

import pytest
from mlstack_doctor import profile as prof
from mlstack_doctor.facts import stack as policy

RULES = prof.shipped_data()["rules"]


def stack(name: str, **more: str | None) -> dict[str, str | None]:
    return {**prof.load(name).expect, "nvidia-cuda-runtime": "13.0.96", "tilelang": None, **more}


@pytest.mark.parametrize(
    "cap,arch", [("9.0", "sm_90"), ("12.0", "sm_120"), ("7.5", "sm_75"), ("", None), ("9", None)]
)
def test_arch_of(cap: str, arch: str | None) -> None:
    assert policy.arch_of(cap) == arch


@pytest.mark.parametrize(
    "version,spec,ok",
    [("3.7.1", ">=3.4.0,<3.7.1", False), ("3.6.0", ">=3.4.0,<3.7.1", True), ("13.0.96", ">=13", True)],
)
def test_version_in(version: str, spec: str, ok: bool) -> None:
    assert policy.version_in(version, spec) is ok


@pytest.mark.parametrize(
    "name,archs,purpose,extra,ids",
    [
        # The default profile trains on Hopper and Blackwell with nothing the policy warns of.
        ("torch211-triton37-fla06", ["sm_90"], "training", {}, []),
        ("torch211-triton37-fla06", ["sm_100"], "training", {}, ["blackwell-triton-lt-3-8"]),
        # FLA 0.5.1 refuses the Gated DeltaNet backward on Hopper without tilelang (FLA #640).
        ("torch211-triton37", ["sm_90"], "training", {}, ["hopper-fla640-any-triton"]),
        ("torch211-triton37", ["sm_90"], "inference", {}, []),
        ("torch211-triton37", ["sm_90"], "training", {"tilelang": "0.1.15"}, ["hopper-tilelang-nvcc"]),
        # CUDA 13 has no kernels below sm_75: refused.
        ("torch211-triton37-fla06", ["sm_70"], "inference", {}, ["cuda13-min-arch"]),
    ],
)
def test_the_rules_that_apply(
    name: str, archs: list[str], purpose: str, extra: dict[str, str], ids: list[str]
) -> None:
    found = policy.applying(RULES, stack(name, **extra), archs, purpose)
    assert [r["id"] for r in found] == ids


@pytest.mark.parametrize(
    "name,cap,status,code",
    [
        ("torch211-triton37-fla06", "9.0", "pass", None),
        ("torch211-triton37", "9.0", "warn", "STACK_POLICY_RULE"),  # training on Hopper needs tilelang
        ("torch211-triton37-fla06", "7.0", "fail", "STACK_POLICY_RULE"),  # CUDA 13: nothing below sm_75
    ],
)
def test_package_versions_applies_the_rules_for_the_gpus_nvml_saw(
    monkeypatch: pytest.MonkeyPatch, name: str, cap: str, status: str, code: str | None
) -> None:
    from mlstack_doctor.context import Context, Options
    from mlstack_doctor.probes import packages

    versions = stack(name)
    monkeypatch.setattr(packages, "installed", lambda dist: versions.get(dist))
    monkeypatch.setattr(packages, "shadowed", lambda found: {})
    monkeypatch.setattr(packages.md, "requires", lambda dist: [f"fla-core=={versions['fla-core']}"])
    ctx = Context(Options(purpose="training"))
    ctx.facts["nvml_gpus"] = [{"index": 0, "compute_capability": cap}]
    r = packages.package_versions(ctx)
    assert (r.status.value, r.code) == (status, code), r.summary
    assert r.evidence["matches_shipped"] == [name]
    assert r.evidence["policy"]["archs"] == [policy.arch_of(cap)]
