# Copied from verify/src/mlstack_doctor/facts/stack.py (the source; a unit test keeps both equal).
"""The stack as profiles/ states it, each fact with one definition: the purposes a container may have, which
folders are stack profiles, what a uv.lock locks, and the stack policy's rules (profiles/policy.yml),
checked and evaluated. Standard library only (see the package's docstring): the collection chooses a
stack with these functions, the doctor judges one with them, the testbed offers the same purposes.

A rule applies where one of the GPUs is in its `archs` and every package it names is at a version in its
range; its `purposes` and `tilelang` narrow it further (rule_hits, applying).
"""

from __future__ import annotations

import os
import re
import sys
from typing import Any

# What a container is for; the first is the default of one that states none. The doctor's verdict follows
# it (training: a backward FLA refuses fails; inference: it warns), so its values are code, not data.
PURPOSES = ("training", "inference")
DEFAULT_PURPOSE = PURPOSES[0]
# A stack profile is a folder under profiles/ holding these files; the policy sits beside them.
PROFILE_FILES = ("profile.yml", "pyproject.toml", "uv.lock")
POLICY_FILE = "policy.yml"
ACTIONS = ("add_extra", "refuse", "warn", "note")
RULE_KEYS = ("id", "archs", "versions", "purposes", "action", "says", "fixed", "sources")
# Packages whose locked versions the rules may test (names normalised as in PEP 503).
POLICY_PACKAGES = ("torch", "triton", "flash-linear-attention", "fla-core", "nvidia-cuda-runtime")
_CAP = re.compile(r"^(\d+)\.(\d+)$")
_ARCH = re.compile(r"^sm_(\d+)(\d)$")
_CLAUSE = re.compile(r"^(>=|<=|==|!=|<|>)\s*(\S+)$")


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def list_profiles(profiles_dir: str) -> list[str]:
    """The stack profiles: the folders under `profiles_dir` holding a profile.yml. One that lacks another
    of PROFILE_FILES is an error naming what to add, never a profile silently left out."""
    names = sorted(
        d for d in os.listdir(profiles_dir) if os.path.isfile(os.path.join(profiles_dir, d, PROFILE_FILES[0]))
    )
    for name in names:
        missing = [f for f in PROFILE_FILES if not os.path.isfile(os.path.join(profiles_dir, name, f))]
        if missing:
            raise ValueError(
                f"{os.path.join(profiles_dir, name)}: a stack profile needs {', '.join(PROFILE_FILES)};"
                f" it lacks {', '.join(missing)} (uv.lock: `uv lock` in that folder)"
            )
    return names


def arch_of(compute_cap: str) -> str | None:
    """nvidia-smi's compute_cap as a CUDA arch: "9.0" -> "sm_90", "12.0" -> "sm_120"; None for others."""
    m = _CAP.match(str(compute_cap or "").strip())
    return f"sm_{int(m.group(1))}{int(m.group(2))}" if m else None


def arch_key(arch: str) -> tuple[int, ...]:
    m = _ARCH.match(arch.strip())
    if not m:
        raise ValueError(f"{arch!r} is not an arch like sm_90 or sm_120")
    return (int(m.group(1)), int(m.group(2)))


def version_key(version: str) -> tuple[int, ...]:
    """The release numbers of a version ("2.11.0+cu130" -> (2, 11, 0)); pre-release tags are ignored."""
    m = re.match(r"^\s*v?(\d+(?:\.\d+)*)", str(version))
    if not m:
        raise ValueError(f"{version!r} is not a version")
    return tuple(int(p) for p in m.group(1).split("."))


def _within(key: tuple[int, ...], spec: str, parse: Any) -> bool:
    """Whether `key` satisfies every comma-separated clause of `spec` (">=3.4.0,<3.7.1")."""
    for clause in str(spec).split(","):
        m = _CLAUSE.match(clause.strip())
        if not m:
            raise ValueError(f"{clause.strip()!r} in {spec!r} is not OP VALUE (>=, <=, ==, !=, <, >)")
        op, other = m.group(1), parse(m.group(2))
        width = max(len(key), len(other))
        a, b = key + (0,) * (width - len(key)), other + (0,) * (width - len(other))
        if not {">=": a >= b, "<=": a <= b, "==": a == b, "!=": a != b, "<": a < b, ">": a > b}[op]:
            return False
    return True


def version_in(version: str, spec: str) -> bool:
    return _within(version_key(version), spec, version_key)


def arch_in(arch: str, spec: str) -> bool:
    return _within(arch_key(arch), spec, arch_key)


def _parse_lock_minimal(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """Python 3.10 has no tomllib: read [[package]] name/version pairs line by line."""
    packages: dict[str, str] = {}
    in_pkg = False
    name: str | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("["):
            in_pkg = line == "[[package]]"
            name = None
            continue
        if not in_pkg:
            continue
        m = re.match(r'(name|version)\s*=\s*"([^"]*)"', line)
        if not m:
            continue
        if m.group(1) == "name":
            name = normalize(m.group(2))
        elif name is not None and name not in packages:
            packages[name] = m.group(2)
    overrides = {}
    for m in re.finditer(r'\{\s*name\s*=\s*"([^"]+)"\s*,\s*specifier\s*=\s*"([^"]*)"\s*\}', text):
        if (
            "overrides" in text[: m.start()].rsplit("[", 1)[-1]
            or "override" in text[max(0, m.start() - 200) : m.start()]
        ):
            overrides[normalize(m.group(1))] = m.group(2)
    return packages, overrides


def parse_lock(text: str) -> tuple[dict[str, str], dict[str, str]]:
    """A uv.lock's packages (normalised name -> its first locked version) and its [manifest] overrides
    (name -> specifier). ValueError when it is not TOML."""
    if sys.version_info < (3, 11):  # noqa: UP036 - the doctor supports 3.10 (no tomllib)
        return _parse_lock_minimal(text)
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"uv.lock is not valid TOML: {exc}") from exc
    packages: dict[str, str] = {}
    for pkg in data.get("package", []):
        if isinstance(pkg, dict) and "name" in pkg and "version" in pkg:
            packages.setdefault(normalize(str(pkg["name"])), str(pkg["version"]))
    overrides: dict[str, str] = {}
    for item in data.get("manifest", {}).get("overrides", []) or []:
        if isinstance(item, dict) and "name" in item:
            overrides[normalize(str(item["name"]))] = str(item.get("specifier", ""))
    return packages, overrides


def check_policy(policy: Any, where: str, profiles: list[str]) -> dict[str, Any]:
    """profiles/policy.yml as parsed, checked: a rule that cannot be evaluated, or a default profile that is
    none of `profiles`, is an error here, not a silent skip."""
    rules = policy.get("rules") if isinstance(policy, dict) else None
    if not isinstance(policy, dict) or not policy.get("default_profile") or not isinstance(rules, list):
        raise ValueError(f"{where}: needs default_profile and a list of rules")
    if policy["default_profile"] not in profiles:
        raise ValueError(
            f"{where}: default_profile {policy['default_profile']!r} is not a stack profile; known: "
            f"{', '.join(profiles)}"
        )
    for rule in policy["rules"]:
        rid = rule.get("id", "?")
        missing = [k for k in RULE_KEYS if k not in rule]
        if missing:
            raise ValueError(f"{where}: rule {rid} lacks {', '.join(missing)}")
        if rule["action"] not in ACTIONS:
            raise ValueError(
                f"{where}: rule {rid}: action {rule['action']!r} is not one of {', '.join(ACTIONS)}"
            )
        if "tilelang" in rule and rule["action"] not in ("warn", "note"):
            raise ValueError(f"{where}: rule {rid}: a tilelang condition is for warn and note rules only")
        if not set(rule["purposes"]) <= set(PURPOSES):
            raise ValueError(f"{where}: rule {rid}: purposes must be among {', '.join(PURPOSES)}")
        arch_in("sm_90", rule["archs"])
        for package, spec in rule["versions"].items():
            if normalize(package) not in POLICY_PACKAGES:
                raise ValueError(f"{where}: rule {rid}: {package} is not one of {', '.join(POLICY_PACKAGES)}")
            version_in("0", spec)
    return policy


def rule_hits(rule: dict[str, Any], archs: list[str], versions: dict[str, str | None]) -> list[str]:
    """The archs among `archs` the rule concerns, where every package it names is at a version in its
    range (`versions`: normalised name -> version, None or absent: not there); [] where it does not apply.
    Purpose and tilelang are the caller's: the collection explains a rule of another purpose."""
    hit = sorted({a for a in archs if arch_in(a, rule["archs"])}, key=arch_key)
    if not hit:
        return []
    for package, spec in rule.get("versions", {}).items():
        found = versions.get(normalize(package))
        if not found or not version_in(str(found), spec):
            return []
    return hit


def applying(
    rules: list[dict[str, Any]],
    installed: dict[str, str | None],
    archs: list[str],
    purpose: str,
) -> list[dict[str, Any]]:
    """The rules that apply to an installed stack, as the doctor judges it: each as {id, action, says, fixed,
    archs: [the GPUs' archs it hit], versions}; an add_extra rule whose package is installed is met."""
    found = []
    for rule in rules:
        hit = rule_hits(rule, archs, installed)
        if not hit or purpose not in rule.get("purposes", ()):
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
                "versions": {p: installed.get(normalize(p)) for p in rule.get("versions", {})},
                **({"provides": rule["provides"]} if "provides" in rule else {}),
                **({"instead": rule["instead"]} if "instead" in rule else {}),
            }
        )
    return found


def shipped(profiles_dir: str, policy: dict[str, Any], packages: tuple[str, ...]) -> dict[str, Any]:
    """What the doctor carries of profiles/ (its shipped_profiles.json): each profile's locked versions of
    `packages` and its overrides, the policy's default profile and its rules (`policy`: policy.yml, parsed
    and checked)."""
    profiles = {}
    for name in list_profiles(profiles_dir):
        with open(os.path.join(profiles_dir, name, "uv.lock"), encoding="utf-8") as f:
            locked, overrides = parse_lock(f.read())
        profiles[name] = {"expect": {p: locked[p] for p in packages if p in locked}, "overrides": overrides}
    return {
        "written_by": "the doctor's wheel build, from profiles/ (edits are replaced)",
        "default_profile": policy["default_profile"],
        "profiles": profiles,
        "rules": policy["rules"],
    }
