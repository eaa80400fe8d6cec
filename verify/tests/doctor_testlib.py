"""Helpers shared by the doctor's tests: run the doctor for real, validate its JSON, write uv.lock
fixtures. (A module of its own: test files never import from conftest, which is ambiguous when
several suites run in one pytest session.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

VERIFY = Path(__file__).resolve().parents[1]
SRC = VERIFY / "src"
if str(SRC) not in sys.path:
    sys.path.insert(0, str(SRC))
SCHEMA = json.loads((SRC / "mlstack_doctor" / "schema" / "report.schema.json").read_text())
PY_VER = f"{sys.version_info.major}.{sys.version_info.minor}"
TEST_TORCH = "2.13.0"
TEST_TRANSFORMERS = "5.17.0"


def validate(report: dict[str, Any]) -> None:
    try:
        import jsonschema
    except ImportError:  # a GPU machine's bare python (the controller venv pins jsonschema)
        missing = [k for k in SCHEMA["required"] if k not in report]
        assert not missing, f"report lacks {missing}"
        return
    jsonschema.validate(report, SCHEMA, format_checker=jsonschema.FormatChecker())


@dataclass
class DoctorRun:
    rc: int
    report: dict[str, Any]
    stdout: str
    stderr: str

    def probe(self, name: str) -> dict[str, Any]:
        return next(p for p in self.report["probes"] if p["name"] == name)

    @property
    def root(self) -> dict[str, Any] | None:
        return self.report["summary"]["root_cause"]


def doctor_env(extra: dict[str, str] | None = None, unset: tuple[str, ...] = ()) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in unset}
    # The doctor's source first; keep what the caller had (a GPU machine's FLA installed with --target).
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)
    env.setdefault("TRITON_CACHE_DIR", "/tmp/mlstack-doctor-test-triton-cache")
    # A provisioned container's doctor settings would set the defaults the tests choose themselves.
    env.setdefault("MLSTACK_DOCTOR_SETTINGS", "")
    env.update(extra or {})
    return env


def run_doctor(
    *args: str,
    python: str = sys.executable,
    env: dict[str, str] | None = None,
    timeout: float = 240,
    preexec: Callable[[], None] | None = None,
    prefix: tuple[str, ...] = (),
) -> DoctorRun:
    """`python -m mlstack_doctor --json --quiet ARGS` for real; the JSON is schema-validated. `preexec`
    runs in the doctor's process before it starts (a resource limit set there); `prefix` is a command the
    doctor's argv is given to (a mount namespace of its own, say)."""
    proc = subprocess.run(
        [*prefix, python, "-m", "mlstack_doctor", "--json", "--quiet", *args],
        capture_output=True,
        text=True,
        env=env if env is not None else doctor_env(),
        timeout=timeout,
        preexec_fn=preexec,
    )
    report: dict[str, Any] = {}
    if proc.returncode in (0, 1):
        report = json.loads(proc.stdout)
        validate(report)
    return DoctorRun(proc.returncode, report, proc.stdout, proc.stderr)


def write_lock(path: Path, versions: dict[str, str]) -> Path:
    """A uv.lock as uv writes it (the parts the doctor reads)."""
    body = ["version = 1", "revision = 3", 'requires-python = ">=3.10"', ""]
    for name, ver in versions.items():
        body += [
            "[[package]]",
            f'name = "{name}"',
            f'version = "{ver}"',
            'source = { registry = "https://pypi.org/simple" }',
            "",
        ]
    path.mkdir(parents=True, exist_ok=True)
    (path / "uv.lock").write_text("\n".join(body))
    return path / "uv.lock"


def fake_site(root: Path, stack: dict[str, tuple[str, list[str]]]) -> Path:
    """A site folder holding only dist-info metadata: distribution -> (version, Requires-Dist lines).
    The doctor's fast tier reads versions and pins from metadata and imports none of them."""
    site = root / "site"
    for dist, (version, requires) in stack.items():
        info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True)
        lines = ["Metadata-Version: 2.1", f"Name: {dist}", f"Version: {version}"]
        lines += [f"Requires-Dist: {r}" for r in requires]
        (info / "METADATA").write_text("\n".join(lines) + "\n")
    return site


def gpu_nodes_state() -> str:
    """What this machine really has: 'none', or 'no_driver' (dummy nodes, ENXIO), or 'ok'."""
    nodes = [p for p in Path("/dev").glob("nvidia*") if p.is_char_device()]
    if not nodes:
        return "none"
    try:
        fd = os.open("/dev/nvidiactl", os.O_RDWR)
    except OSError:
        return "no_driver"
    os.close(fd)
    return "ok"
