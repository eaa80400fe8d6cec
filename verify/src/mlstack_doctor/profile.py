"""Expected versions: a uv.lock, a shipped profile's name, or none (no pins of ours).

Inside a provisioned container the doctor's settings name the lock its venv was built from
(mlstack_doctor.settings). Elsewhere, without --profile, the doctor checks no pins: only combinations
known not to work (FLA against the fla-core it pins, torch's own triton pin, the stack policy's rules;
facts/stack.py), and says which shipped profile the installed stack matches. The shipped profiles (the
collection's profiles/: each folder's uv.lock, policy.yml's default and rules) travel with the doctor's
wheel as shipped_profiles.json, which its build writes from profiles/ (the collection's doctor_wheel
action); run from a checkout, the doctor reads profiles/ itself, policy.yml with PyYAML (a tool of the
checkout). Nothing restates them. Where they cannot be read (a checkout's python without PyYAML, a wheel
built without the file) a ProfileError says why: --profile NAME cannot run, a uv.lock given as --profile
still can, and package_versions reports the shipped match and the policy's rules as not evaluated.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

# The packages of the stack whose versions the doctor checks, by distribution name (STACK).
from mlstack_doctor.facts import stack
from mlstack_doctor.facts.packages import STACK

SHIPPED_FILE = "shipped_profiles.json"
# The name that stands for the stack policy's default profile.
DEFAULT = "default"
# A version spec that any installed version meets: the package must be there, at no version of ours.
ANY = "*"


class ProfileError(Exception):
    """The profile cannot be read: the doctor cannot run (exit 2)."""


@dataclass
class Profile:
    name: str
    source: str
    expect: dict[str, str]  # distribution -> version spec: "2.11.0" (exact) or "2.11.*" (prefix); {}: no pins
    overrides: dict[str, str] = field(default_factory=dict)  # [manifest] overrides of the lock

    @property
    def pinned(self) -> bool:
        return any(spec != ANY for spec in self.expect.values())

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "source": self.source, "expect": self.expect, "overrides": self.overrides}


def unpinned() -> Profile:
    """No profile given: the stack's packages must be installed, at no versions of ours."""
    return Profile(
        "none",
        "no --profile and no doctor settings: no pins, only combinations known not to work",
        {d: ANY for d in STACK},
    )


normalize = stack.normalize


def load_lock(path: Path, spec: str) -> Profile:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"profile {spec!r}: cannot read {path}: {exc}") from exc
    try:
        packages, overrides = stack.parse_lock(text)
    except ValueError as exc:
        raise ProfileError(f"profile {spec!r}: {path}: {exc}") from exc
    expect = {name: packages[name] for name in STACK if name in packages}
    if not expect:
        raise ProfileError(f"profile {spec!r}: {path} locks none of {', '.join(STACK)}")
    return Profile(path.parent.name or str(path), str(path), expect, overrides)


# The collection's profiles/ where the doctor runs from its sources, laid out as in the checkout
# (verify/src/mlstack_doctor beside profiles/; the testbed mounts both so).
CHECKOUT_PROFILES = Path(__file__).resolve().parents[3] / "profiles"


@cache
def shipped_data() -> dict[str, Any]:
    """The shipped profiles and stack policy: read from the checkout's profiles/ where the doctor runs from
    its sources, else as its wheel carries them (shipped_profiles.json, written by the build)."""
    if (CHECKOUT_PROFILES / stack.POLICY_FILE).is_file():
        return shipped_from(CHECKOUT_PROFILES)
    try:
        text = resources.files("mlstack_doctor").joinpath(SHIPPED_FILE).read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(
            f"this doctor carries no {SHIPPED_FILE}: build its wheel with the collection's doctor role "
            f"(it writes the file from profiles/), or run it from a checkout ({exc})"
        ) from exc
    return json.loads(text)


def shipped() -> dict[str, Profile]:
    """The collection's profiles, by name."""
    return {
        name: Profile(name, f"shipped profile {name}", dict(p["expect"]), dict(p["overrides"]))
        for name, p in shipped_data()["profiles"].items()
    }


def load(spec: str | None) -> Profile:
    """None (no pins), `default` (the stack policy's default profile), a shipped profile's name, a
    uv.lock file, or a directory holding one."""
    if spec is None:
        return unpinned()
    path = Path(spec)
    if path.is_dir():
        path = path / "uv.lock"
    try:
        profiles = shipped()
        name = shipped_data()["default_profile"] if spec == DEFAULT else spec
    except ProfileError as exc:
        if spec != DEFAULT and path.is_file():  # a lock of its own needs no shipped profile
            return load_lock(path, spec)
        raise ProfileError(f"profile {spec!r}: the shipped profiles cannot be read: {exc}") from exc
    if name in profiles:
        return profiles[name]
    if not path.is_file():
        raise ProfileError(
            f"profile {spec!r}: no uv.lock at {path}, and not a shipped profile "
            f"({', '.join(sorted(profiles))}, or {DEFAULT})"
        )
    return load_lock(path, spec)


def matching_shipped(found: dict[str, str | None]) -> list[str]:
    """The shipped profiles whose every locked stack version is the one installed."""
    return sorted(
        name
        for name, p in shipped().items()
        if all(found.get(d) and matches(str(found[d]), spec) for d, spec in p.expect.items())
    )


def declared_override(
    profile: Profile | None, matched: list[str], dist: str, installed: str
) -> Profile | None:
    """Who declares `dist` at `installed` (over torch's pin): the profile checked where it pins, else a
    shipped profile the stack matches; None where no one does."""
    for p in [profile] if profile and profile.pinned else [shipped()[n] for n in matched]:
        expected = p.expect.get(dist)
        if expected and expected != ANY and matches(installed, expected):
            return p
    return None


def _release(version: str) -> list[str]:
    """'2.11.0+cu130' -> ['2', '11', '0']; pre/post/dev tags stay on the last part."""
    return version.split("+", 1)[0].split(".")


def matches(installed: str, spec: str) -> bool:
    """Exact ('2.11.0', local tag ignored unless the spec has one) or prefix ('2.11.*')."""
    spec = spec.strip().lstrip("=")
    if spec == ANY:
        return True
    if spec.endswith(".*"):
        want = spec[:-2].split(".")
        return _release(installed)[: len(want)] == want
    if "+" in spec:
        return installed == spec
    return _release(installed) == _release(spec) or installed.split("+", 1)[0] == spec


def pin_of(requirement: str) -> tuple[str, str] | None:
    """'triton==3.6.0; platform_system == "Linux"' -> ('triton', '3.6.0'); None for other forms."""
    req = requirement.split(";", 1)[0].strip()
    m = re.match(r"([A-Za-z0-9_.\-]+)\s*(?:\[[^\]]*\])?\s*==\s*([^\s,]+)$", req)
    if not m:
        return None
    return normalize(m.group(1)), m.group(2)


def unpaired_fla(found: dict[str, str | None], requires: list[str]) -> dict[str, str] | None:
    """flash-linear-attention beside a fla-core other than the one it pins (`requires`: its Requires-Dist
    lines): {"flash-linear-attention", "pins", "installed"}, or None where they pair or nothing pins."""
    fla = found.get("flash-linear-attention")
    if not fla:
        return None
    pins = [v for n, v in (p for p in map(pin_of, requires) if p) if n == "fla-core"]
    if not pins:
        return None
    core = found.get("fla-core")
    if core and matches(core, pins[0]):
        return None
    return {
        "flash-linear-attention": fla,
        "pins": f"fla-core=={pins[0]}",
        "installed": core or "not installed",
    }


def shipped_from(profiles_dir: Path) -> dict[str, Any]:
    """What shipped_profiles.json holds, read from a checkout's profiles/ (PyYAML: a tool of the checkout,
    never needed at run time in a container; a python without it raises ProfileError)."""
    policy_file = profiles_dir / stack.POLICY_FILE
    try:
        import yaml
    except ImportError as exc:
        raise ProfileError(
            f"{policy_file} is read with PyYAML, which {sys.executable} lacks: install pyyaml there, or run "
            f"the doctor's wheel (it carries {SHIPPED_FILE})"
        ) from exc
    policy = stack.check_policy(
        yaml.safe_load(policy_file.read_text(encoding="utf-8")),
        str(policy_file),
        stack.list_profiles(str(profiles_dir)),
    )
    return stack.shipped(str(profiles_dir), policy, STACK)
