"""The arch-aware stack policy: which stack profile and extras a container gets on its GPUs.

Inputs are what a node and the repository say for themselves: the GPUs from nvidia-smi's csv answer
(nvidia_facts.parse_nvidia_smi_csv, as node_state reads them), each profile's LOCKED versions
(profiles/<name>/uv.lock) and extras (its pyproject.toml), and the rules of profiles/policy.yml.
Nothing is inferred from a profile's name. The profile list, the purposes and the rules' evaluation are
stack_facts' (the doctor's facts/stack.py, copied); this module applies them to one container. Pure
functions; standard library plus PyYAML (the controller has it through ansible-core).
"""

from __future__ import annotations

import os
import re
from typing import Any

from ansible_collections.mlstack.pve.plugins.module_utils import stack_facts
from ansible_collections.mlstack.pve.plugins.module_utils.stack_facts import (
    DEFAULT_PURPOSE,
    POLICY_FILE,
    POLICY_PACKAGES,
    PURPOSES,
    arch_in,
    list_profiles,
    version_in,
)

# What the stack policy offers its callers (tests included), its own or stack_facts'.
__all__ = [
    "DEFAULT_PURPOSE",
    "POLICY_PACKAGES",
    "PURPOSES",
    "arch_in",
    "arch_of",
    "choose_stack",
    "evaluate",
    "list_profiles",
    "load_policy",
    "read_profile",
    "version_in",
]
_normalise = stack_facts.normalize
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_arch_key = stack_facts.arch_key


def arch_of(compute_cap: str) -> str:
    """nvidia-smi's compute_cap as a CUDA arch: "9.0" -> "sm_90", "12.0" -> "sm_120"."""
    arch = stack_facts.arch_of(compute_cap)
    if arch is None:
        raise ValueError(f"compute_cap {compute_cap!r} is not MAJOR.MINOR")
    return arch


def load_policy(profiles_dir: str) -> dict[str, Any]:
    """profiles/policy.yml, checked (stack_facts.check_policy): a rule that cannot be evaluated is an
    error here, not a silent skip."""
    import yaml

    path = os.path.join(profiles_dir, POLICY_FILE)
    with open(path, encoding="utf-8") as f:
        policy = yaml.safe_load(f)
    return stack_facts.check_policy(policy, path, list_profiles(profiles_dir))


def read_profile(profiles_dir: str, name: str) -> dict[str, Any]:
    """A profile's locked versions of POLICY_PACKAGES, its extras, and which of them provide tilelang."""
    import tomllib  # Python >= 3.11: the controller

    root = os.path.join(profiles_dir, name)
    with open(os.path.join(root, "uv.lock"), encoding="utf-8") as f:
        locked, _ = stack_facts.parse_lock(f.read())
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f).get("project", {})
    versions = {p: locked[p] for p in POLICY_PACKAGES if p in locked}
    extras = project.get("optional-dependencies", {})
    tilelang = [
        extra
        for extra, reqs in extras.items()
        if any((m := _REQ_NAME.match(r)) and _normalise(m.group(1)) == "tilelang" for r in reqs)
    ]
    return {"name": name, "versions": versions, "extras": sorted(extras), "tilelang_extras": tilelang}


def write_shipped(profiles_dir: str, out: str, packages: tuple[str, ...]) -> bool:
    """The doctor's shipped_profiles.json at `out`, from profiles/ (stack_facts.shipped), written where it
    differs; whether it did."""
    import json

    text = json.dumps(
        stack_facts.shipped(profiles_dir, load_policy(profiles_dir), packages), indent=1, sort_keys=True
    )
    try:
        with open(out, encoding="utf-8") as f:
            if f.read() == text + "\n":
                return False
    except FileNotFoundError:
        pass
    with open(out, "w", encoding="utf-8") as f:
        f.write(text + "\n")
    return True


def _describe(gpus: list[dict[str, Any]]) -> str:
    seen: dict[str, None] = {}
    for g in gpus:
        seen.setdefault(f"{g.get('name') or 'GPU'} ({arch_of(g['compute_cap'])})", None)
    return ", ".join(seen)


def _locks(profile: dict[str, Any], packages: Any) -> str:
    return ", ".join(f"{p} {profile['versions'][_normalise(p)]}" for p in packages)


def evaluate(
    profile: dict[str, Any],
    gpus: list[dict[str, Any]],
    purpose: str,
    explicit_extras: list[str] | None,
    policy: dict[str, Any],
) -> tuple[list[str], list[str], list[tuple[dict[str, Any], str]]]:
    """Apply the rules to one profile: (extras, reasons, [(refusing rule, GPUs it refused)])."""
    extras = list(explicit_extras) if explicit_extras is not None else []
    reasons: list[str] = []
    refusals: list[tuple[dict[str, Any], str]] = []
    deferred = []
    for rule in policy["rules"]:
        archs = stack_facts.rule_hits(rule, [arch_of(g["compute_cap"]) for g in gpus], profile["versions"])
        hit = [g for g in gpus if arch_of(g["compute_cap"]) in archs]
        if not hit:
            continue
        where = f"{_describe(hit)}, {_locks(profile, rule['versions'])}"
        if purpose not in rule["purposes"]:
            if rule["action"] in ("add_extra", "refuse"):
                reasons.append(
                    f"{rule['id']} not applied: it concerns {' and '.join(rule['purposes'])} only ({where})"
                )
            continue
        if "tilelang" in rule:
            deferred.append((rule, where))
            continue
        if rule["action"] == "add_extra":
            provider = [e for e in extras if e in profile["tilelang_extras"]]
            if provider:
                given = ", set in the inventory," if explicit_extras is not None else ""
                reasons.append(f"extra {provider[0]} (tilelang){given} is needed: {rule['id']} ({where})")
            elif explicit_extras is not None or not profile["tilelang_extras"]:
                refusals.append((rule, where))
            else:
                extras.append(profile["tilelang_extras"][0])
                reasons.append(
                    f"extra {extras[-1]} (tilelang) added for {purpose}: {rule['id']} ({where}): "
                    f"{rule['says']}; fixed: {rule['fixed']} ({rule['sources'][0]})"
                )
        elif rule["action"] == "refuse":
            refusals.append((rule, where))
        else:
            reasons.append(_line(rule, where))
    has_tilelang = any(e in profile["tilelang_extras"] for e in extras)
    reasons += [_line(rule, where) for rule, where in deferred if bool(rule["tilelang"]) == has_tilelang]
    return extras, reasons, refusals


def _line(rule: dict[str, Any], where: str) -> str:
    kind = "warning" if rule["action"] == "warn" else "note"
    return f"{kind}: {rule['id']} ({where}): {rule['says']}; fixed: {rule['fixed']} ({rule['sources'][0]})"


def choose_stack(
    gpus: list[dict[str, Any]],
    container: dict[str, Any],
    profiles_dir: str,
    policy: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The effective profile, extras and purpose of one container on the GPUs it gets, and why.

    An explicit inventory `profile` wins over the default, explicit `extras` over derived ones; when the
    explicit choice cannot work on those GPUs, `refused` says why and what to choose instead.
    """
    policy = policy or load_policy(profiles_dir)
    who = f"container {container.get('vmid', '?')}" + (
        f" ({container['hostname']})" if container.get("hostname") else ""
    )
    purpose = container.get("purpose") or DEFAULT_PURPOSE
    if purpose not in PURPOSES:
        raise ValueError(f"{who}: purpose {purpose!r} is not one of {', '.join(PURPOSES)}")
    known = list_profiles(profiles_dir)
    explicit_profile = bool(container.get("profile"))
    name = container["profile"] if explicit_profile else policy["default_profile"]
    if name not in known:
        raise ValueError(
            f"{who}: profile {name!r} is not a stack profile in {profiles_dir}; known: {', '.join(known)}"
        )
    profile = read_profile(profiles_dir, name)
    explicit_extras = container.get("extras")
    if explicit_extras is not None:
        if not isinstance(explicit_extras, list) or not all(isinstance(e, str) for e in explicit_extras):
            raise ValueError(f"{who}: extras must be a list of extra names, not {explicit_extras!r}")
        unknown = [e for e in explicit_extras if e not in profile["extras"]]
        if unknown:
            raise ValueError(
                f"{who}: profile {name} has no extra {', '.join(unknown)}; "
                f"its extras: {', '.join(profile['extras']) or 'none'}"
            )
    if not isinstance(gpus, list) or not all(isinstance(g, dict) and "compute_cap" in g for g in gpus):
        raise ValueError(f"{who}: gpus must be a list of {{index, name, uuid, compute_cap}}, not {gpus!r}")
    archs = sorted({arch_of(g["compute_cap"]) for g in gpus}, key=_arch_key)
    why = "set in the inventory" if explicit_profile else "the default (profiles/policy.yml)"
    reasons = [f"profile {name}: {why}; locks {_locks(profile, sorted(profile['versions']))}"]
    if not gpus:
        reasons.append(
            "GPU architecture unknown: no GPU of this container answered nvidia-smi on the node (no driver, "
            "or none passed through); no architecture rule applied, the doctor checks the stack where it runs"
        )
    if len(archs) > 1:
        reasons.append(
            f"warning: mixed architectures {', '.join(archs)} in one container: FLA takes the architecture "
            "of CUDA device 0 for its Hopper and Blackwell guards and configs and applies them to every "
            "device; the rules of each architecture are applied here"
        )
    extras, more, refusals = evaluate(profile, gpus, purpose, explicit_extras, policy)
    reasons += more
    refused = None
    if refusals:
        refused = " ".join(
            _refusal(who, name, explicit_extras, purpose, r, w, gpus, profiles_dir, known, policy)
            for r, w in refusals
        )
    return {
        "profile": name,
        "extras": extras,
        "purpose": purpose,
        "archs": archs,
        "explicit": {"profile": explicit_profile, "extras": explicit_extras is not None},
        "reasons": reasons,
        "refused": refused,
    }


def _refusal(
    who: str,
    name: str,
    explicit_extras: list[str] | None,
    purpose: str,
    rule: dict[str, Any],
    where: str,
    gpus: list[dict[str, Any]],
    profiles_dir: str,
    known: list[str],
    policy: dict[str, Any],
) -> str:
    """One refusal, naming the container, the GPUs, why, and what would work there instead."""
    # Profiles that work on these GPUs for this purpose with no extra at all.
    fine = [
        other
        for other in known
        if other != name
        and not (found := evaluate(read_profile(profiles_dir, other), gpus, purpose, None, policy))[2]
        and not found[0]
    ]
    instead = []
    if rule["action"] == "add_extra":
        profile = read_profile(profiles_dir, name)
        if profile["tilelang_extras"]:
            listed = explicit_extras if explicit_extras is not None else []
            instead.append(f"extras {sorted(set(listed) | {profile['tilelang_extras'][0]})}")
            why = f"{rule['says']}, and the extras set in the inventory ({listed}) provide no tilelang"
        else:
            why = f"{rule['says']}, and profile {name} has no extra providing tilelang"
        instead.append("purpose: inference (the refusal is in the backward only)")
    else:
        why = rule["says"]
        if rule.get("instead"):
            instead.append(rule["instead"])
    instead[:0] = [f"profile {p}" for p in fine]
    return (
        f"{who}: {where} (profile {name}, purpose {purpose}): {rule['id']}: {why}. "
        f"Instead: {' or '.join(instead) or 'no profile here works on that GPU'} ({rule['sources'][0]})."
    )
