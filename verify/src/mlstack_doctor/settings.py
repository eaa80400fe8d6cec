"""The doctor's settings in a provisioned container, and what `--purpose` may be.

The doctor role writes /etc/mlstack/doctor.json once per container (its copy validates it with
`python -m mlstack_doctor.settings check FILE`); every run of `mlstack-doctor` there takes its defaults
from it (explicit flags still win), so the provisioning run, the NCCL tier, the warm and stress steps,
the timers and a person typing `mlstack-doctor` check the same things. Elsewhere there is no such file
and the doctor checks what it finds. MLSTACK_DOCTOR_SETTINGS names another file (empty: none).

The file is one JSON object; every key is optional:
  venv               the container's active venv (a link followed at each run)
  lock               the uv.lock that venv was built from; a doctor running in a venv that holds its own
                     uv.lock (an upgrade's candidate, checked before the switch) checks that one instead
  model              tiny | 27b | a path inside the container
  purpose            one of PURPOSES
  expect_gpu         whether GPUs are expected (false: --no-gpu)
  triton_cache_root  the shared Triton cache root; a run uses <root>/<name of the venv it runs in>
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

# What a container is for (PURPOSES; training: a backward FLA refuses fails, inference: forward only) is
# defined once, with the stack's other facts; the doctor's callers read it here.
from mlstack_doctor.facts.stack import DEFAULT_PURPOSE as DEFAULT_PURPOSE
from mlstack_doctor.facts.stack import PURPOSES

PATH = "/etc/mlstack/doctor.json"
ENV = "MLSTACK_DOCTOR_SETTINGS"


# key -> its JSON type
KEYS: dict[str, type] = {
    "venv": str,
    "lock": str,
    "model": str,
    "purpose": str,
    "expect_gpu": bool,
    "triton_cache_root": str,
}
_PATHS = ("venv", "lock", "triton_cache_root")


class SettingsError(Exception):
    """The settings file exists but cannot be used: the doctor cannot run (exit 2)."""


@dataclass(frozen=True)
class Settings:
    source: str
    venv: str | None = None
    lock: str | None = None
    model: str | None = None
    purpose: str | None = None
    expect_gpu: bool | None = None
    triton_cache_root: str | None = None

    def to_json(self) -> dict[str, object]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    def lock_for(self, prefix: str | None = None) -> str | None:
        """The lock to check: the running venv's (`prefix`, default this interpreter's) own uv.lock where
        it holds one (the lock it was built from), else the file's."""
        own = Path(os.path.realpath(prefix or sys.prefix)) / "uv.lock"
        return str(own) if own.is_file() else self.lock


def path() -> str | None:
    """The settings file's path, or None where MLSTACK_DOCTOR_SETTINGS is set empty."""
    return os.environ.get(ENV, PATH) or None


def parse(text: str, source: str) -> Settings:
    """The file's text, checked; SettingsError names the key to fix."""
    try:
        raw = json.loads(text)
    except ValueError as exc:
        raise SettingsError(f"{source} is not JSON ({exc}): fix or remove it") from None
    if not isinstance(raw, dict):
        raise SettingsError(f"{source} must hold one JSON object, not {type(raw).__name__}")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise SettingsError(f"{source}: unknown keys {', '.join(unknown)} (known: {', '.join(KEYS)})")
    for key, value in raw.items():
        if not isinstance(value, KEYS[key]):
            raise SettingsError(f"{source}: {key} must be a JSON {KEYS[key].__name__}, not {value!r}")
    if "purpose" in raw and raw["purpose"] not in PURPOSES:
        raise SettingsError(f"{source}: purpose must be one of {', '.join(PURPOSES)}, not {raw['purpose']!r}")
    for key in _PATHS:
        if key in raw and not os.path.isabs(raw[key]):
            raise SettingsError(f"{source}: {key} must be an absolute path, not {raw[key]!r}")
    if raw.get("model") == "":
        raise SettingsError(f"{source}: model must be tiny, 27b or a path, not empty")
    return Settings(source=source, **raw)


def load() -> Settings | None:
    """This machine's settings, or None where there is no file."""
    where = path()
    if where is None:
        return None
    try:
        text = Path(where).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"cannot read {where}: {getattr(exc, 'strerror', None) or exc}") from None
    return parse(text, where)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m mlstack_doctor.settings",
        description="Check a doctor settings file (exit 0, its settings as JSON) or show this machine's.",
    )
    sub = p.add_subparsers(dest="action", required=True)
    sub.add_parser("check", help="check FILE").add_argument("file")
    sub.add_parser("show", help=f"the settings in effect ({ENV} or {PATH})")
    args = p.parse_args(argv)
    try:
        if args.action == "check":
            found: Settings | None = parse(Path(args.file).read_text(encoding="utf-8"), args.file)
        else:
            found = load()
    except (SettingsError, OSError, UnicodeDecodeError) as exc:
        sys.stderr.write(f"mlstack-doctor settings: {exc}\n")
        return 2
    json.dump(found.to_json() if found else None, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
