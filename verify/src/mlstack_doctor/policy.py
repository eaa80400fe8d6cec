"""The stack policy's rules (profiles/policy.yml, carried in shipped_profiles.json), evaluated against the
installed packages and the GPUs the doctor sees.

A rule applies when one of the GPUs is in its `archs`, every package it names is installed at a version
in its range, the purpose is among its `purposes`, and (when it says) whether tilelang is installed
matches. What the doctor makes of it: `refuse` fails (the stack cannot work on that GPU), `warn` warns
(a known upstream bug there), `add_extra` warns while the package it provides is missing (training needs
it: FLA refuses the backward without it), `note` is evidence only. Without a GPU architecture (--no-gpu,
no NVML answer) no rule can be evaluated, and the evidence says so. Standard library only.
"""

from __future__ import annotations

import re
from typing import Any

_CLAUSE = re.compile(r"^(>=|<=|==|!=|<|>)\s*(\S+)$")
_ARCH = re.compile(r"^sm_(\d+)(\d)$")
_CAP = re.compile(r"^(\d+)\.(\d+)$")


def _version_key(text: str) -> tuple[int, ...]:
    """Release numbers ("2.11.0+cu130" -> (2, 11, 0)); pre-release tags are ignored."""
    m = re.match(r"^\s*v?(\d+(?:\.\d+)*)", str(text))
    if not m:
        raise ValueError(f"{text!r} is not a version")
    return tuple(int(p) for p in m.group(1).split("."))


def _arch_key(arch: str) -> tuple[int, ...]:
    m = _ARCH.match(arch.strip())
    if not m:
        raise ValueError(f"{arch!r} is not an arch like sm_90 or sm_120")
    return (int(m.group(1)), int(m.group(2)))


def _within(key: tuple[int, ...], spec: str, parse: Any) -> bool:
    for clause in str(spec).split(","):
        m = _CLAUSE.match(clause.strip())
        if not m:
            raise ValueError(f"{clause.strip()!r} in {spec!r} is not OP VALUE")
        op, other = m.group(1), parse(m.group(2))
        width = max(len(key), len(other))
        a, b = key + (0,) * (width - len(key)), other + (0,) * (width - len(other))
        if not {">=": a >= b, "<=": a <= b, "==": a == b, "!=": a != b, "<": a < b, ">": a > b}[op]:
            return False
    return True


def version_in(version: str, spec: str) -> bool:
    return _within(_version_key(version), spec, _version_key)


def arch_in(arch: str, spec: str) -> bool:
    return _within(_arch_key(arch), spec, _arch_key)


def arch_of(compute_capability: str) -> str | None:
    """ "9.0" -> "sm_90"; None for anything else."""
    m = _CAP.match(str(compute_capability or "").strip())
    return f"sm_{int(m.group(1))}{int(m.group(2))}" if m else None


def applying(
    rules: list[dict[str, Any]],
    installed: dict[str, str | None],
    archs: list[str],
    purpose: str,
) -> list[dict[str, Any]]:
    """The rules that apply here, each as {id, action, says, fixed, archs: [the GPUs' archs it hit]};
    `installed`: distribution -> version (None: not installed), names normalised as in PEP 503."""
    found = []
    for rule in rules:
        hit = sorted({a for a in archs if arch_in(a, rule["archs"])})
        versions = rule.get("versions", {})
        if not hit or purpose not in rule.get("purposes", ()):
            continue
        if not all(installed.get(p) and version_in(str(installed[p]), s) for p, s in versions.items()):
            continue
        if "tilelang" in rule and bool(installed.get("tilelang")) is not bool(rule["tilelang"]):
            continue
        if rule["action"] == "add_extra" and installed.get(rule.get("provides", "")):
            continue
        found.append(
            {
                "id": rule["id"],
                "action": rule["action"],
                "says": rule["says"],
                "fixed": rule.get("fixed", ""),
                "archs": hit,
                "versions": {p: installed[p] for p in versions},
                **({"provides": rule["provides"]} if "provides" in rule else {}),
                **({"instead": rule["instead"]} if "instead" in rule else {}),
            }
        )
    return found
