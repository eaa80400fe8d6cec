"""Expected versions: a uv.lock, a shipped profile's name, or none (no pins of ours).

Inside a provisioned container the doctor's settings name the lock its venv was built from
(mlstack_doctor.settings). Elsewhere, without --profile, the doctor checks no pins: only combinations
known not to work (FLA against the fla-core it pins, torch's own triton pin, the stack policy's rules;
policy.py), and says which shipped profile the installed stack matches. The shipped profiles (the
collection's profiles/<name>/uv.lock) travel with the doctor as shipped_profiles.json, written by
`python -m mlstack_doctor.profile write-shipped PROFILES_DIR` and kept equal to profiles/ by a test.
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


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


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


def _parse_lock(text: str) -> tuple[dict[str, str], dict[str, str]]:
    if sys.version_info < (3, 11):  # noqa: UP036 - the doctor supports 3.10 (no tomllib)
        return _parse_lock_minimal(text)
    import tomllib

    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"uv.lock is not valid TOML: {exc}") from exc
    packages: dict[str, str] = {}
    for pkg in data.get("package", []):
        if isinstance(pkg, dict) and "name" in pkg and "version" in pkg:
            packages.setdefault(normalize(str(pkg["name"])), str(pkg["version"]))
    overrides: dict[str, str] = {}
    for item in data.get("manifest", {}).get("overrides", []) or []:
        if isinstance(item, dict) and "name" in item:
            overrides[normalize(str(item["name"]))] = str(item.get("specifier", ""))
    return packages, overrides


def load_lock(path: Path, spec: str) -> Profile:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"profile {spec!r}: cannot read {path}: {exc}") from exc
    packages, overrides = _parse_lock(text)
    expect = {name: packages[name] for name in STACK if name in packages}
    if not expect:
        raise ProfileError(f"profile {spec!r}: {path} locks none of {', '.join(STACK)}")
    return Profile(path.parent.name or str(path), str(path), expect, overrides)


@cache
def shipped_data() -> dict[str, Any]:
    """The shipped profiles and stack policy as the doctor carries them (shipped_profiles.json)."""
    text = resources.files("mlstack_doctor").joinpath(SHIPPED_FILE).read_text(encoding="utf-8")
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
    profiles = shipped()
    name = shipped_data()["default_profile"] if spec == DEFAULT else spec
    if name in profiles:
        return profiles[name]
    path = Path(spec)
    if path.is_dir():
        path = path / "uv.lock"
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


def shipped_from(profiles_dir: Path, policy: dict[str, Any]) -> dict[str, Any]:
    """What shipped_profiles.json holds: each profiles/<name>/uv.lock's stack versions and overrides, the
    policy's default profile and its rules (`policy`: profiles/policy.yml, parsed)."""
    profiles = {}
    for lock in sorted(profiles_dir.glob("*/uv.lock")):
        p = load_lock(lock, lock.parent.name)
        profiles[lock.parent.name] = {"expect": p.expect, "overrides": p.overrides}
    return {
        "written_by": "python -m mlstack_doctor.profile write-shipped profiles (edits are replaced)",
        "default_profile": policy["default_profile"],
        "profiles": profiles,
        "rules": policy["rules"],
    }


def main(argv: list[str] | None = None) -> int:
    """`write-shipped PROFILES_DIR`: write shipped_profiles.json beside this module (PyYAML needed)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "write-shipped":
        sys.stderr.write("usage: python -m mlstack_doctor.profile write-shipped PROFILES_DIR\n")
        return 2
    import yaml  # a tool of the checkout, never needed at run time

    profiles_dir = Path(args[1])
    policy = yaml.safe_load((profiles_dir / "policy.yml").read_text(encoding="utf-8"))
    out = Path(__file__).with_name(SHIPPED_FILE)
    out.write_text(json.dumps(shipped_from(profiles_dir, policy), indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
