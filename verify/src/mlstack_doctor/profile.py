"""Expected versions: from a uv.lock (the provisioning role passes the locked project) or `default`."""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

# The packages of the stack whose versions the doctor checks, by distribution name.
STACK = ("torch", "triton", "flash-linear-attention", "fla-core", "transformers")

DEFAULT_EXPECT = {
    "torch": "2.11.*",
    "triton": "3.6.*",
    "flash-linear-attention": "0.5.*",
    "fla-core": "0.5.*",
    "transformers": "5.*",
}


class ProfileError(Exception):
    """The profile cannot be read: the doctor cannot run (exit 2)."""


@dataclass
class Profile:
    name: str
    source: str
    expect: dict[str, str]  # distribution -> version spec: "2.11.0" (exact) or "2.11.*" (prefix)
    overrides: dict[str, str] = field(default_factory=dict)  # [manifest] overrides of the lock

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "source": self.source, "expect": self.expect, "overrides": self.overrides}


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


def load(spec: str) -> Profile:
    """`default`, a uv.lock file, or a directory holding one."""
    if spec == "default":
        return Profile("default", "built-in", dict(DEFAULT_EXPECT))
    path = Path(spec)
    if path.is_dir():
        path = path / "uv.lock"
    if not path.is_file():
        raise ProfileError(f"profile {spec!r}: no uv.lock at {path} (and not the built-in name 'default')")
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"profile {spec!r}: cannot read {path}: {exc}") from exc
    packages, overrides = _parse_lock(text)
    expect = {name: packages[name] for name in STACK if name in packages}
    if not expect:
        raise ProfileError(f"profile {spec!r}: {path} locks none of {', '.join(STACK)}")
    return Profile(path.parent.name or str(path), str(path), expect, overrides)


def _release(version: str) -> list[str]:
    """'2.11.0+cu130' -> ['2', '11', '0']; pre/post/dev tags stay on the last part."""
    return version.split("+", 1)[0].split(".")


def matches(installed: str, spec: str) -> bool:
    """Exact ('2.11.0', local tag ignored unless the spec has one) or prefix ('2.11.*')."""
    spec = spec.strip().lstrip("=")
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
